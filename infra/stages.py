"""Typed settings of one deployment stage (`cdk synth -c stage=prod`).

Everything that differs between stages lives here, validated when the stage is built,
so a bad combination (a drain longer than ECS waits, more minimum than maximum tasks)
fails at synth time instead of in production.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs

from agentq.config import WarmAgent
from agentq.resources import APP_NAME_DEFAULT, ResourceNames

# What every stage ships unless it says otherwise: the bundled samples (repo-relative).
SAMPLE_DEFINITIONS: Final = (Path("definitions/samples"),)

# Fargate waits at most 120 s between SIGTERM and SIGKILL; a longer stopTimeout is rejected.
FARGATE_MAX_STOP_TIMEOUT_S: Final = 120


class StageError(ValueError):
    """A stage's settings contradict each other or name an unknown stage."""


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    cpu: int = 1024
    memory_mib: int = 2048
    slots: int = 3  # MAX_CONCURRENT_CLAUDE: task slots per worker task
    min_tasks: int = 0
    max_tasks: int = 4
    # Target of the backlog-per-task policy: visible messages each running task may leave waiting.
    backlog_per_task: int = 3
    drain_timeout_s: int = 100
    # Between SIGTERM and SIGKILL; must exceed the drain so ECS never kills a draining worker.
    stop_timeout_s: int = FARGATE_MAX_STOP_TIMEOUT_S
    task_timeout_s: int = 200
    # WARM_AGENT: "always" for a service that mostly runs agent tasks (no cold SDK import
    # for the first task after a quiet spell), "never" for python-only services.
    warm_agent: WarmAgent = "recent"
    # Fargate Spot: tasks placed on FARGATE_SPOT per `spot_weight` tasks on FARGATE
    # (0: on-demand only), after `on_demand_base` on-demand tasks. Spot's two-minute
    # interruption warning is a SIGTERM, and the drain fits inside stop_timeout_s.
    spot_weight: int = 0
    on_demand_base: int = 0
    scale_out_cooldown_s: int = 60
    scale_in_cooldown_s: int = 300
    nat_gateways: int = 1
    # METRIC_TENANTS: tenants with their own worker metrics (docs/operations.md, "Metrics").
    metric_tenants: tuple[str, ...] = ()
    # TENANT_CONCURRENCY_LIMIT: each tenant's fleet-wide cap on running tasks (0: none);
    # per-tenant overrides live in the events table (`agentq tenants limit`).
    tenant_concurrency_limit: int = 0

    def check(self) -> None:
        if not 0 < self.stop_timeout_s <= FARGATE_MAX_STOP_TIMEOUT_S:
            raise StageError(
                f"worker stop_timeout_s must be 1..{FARGATE_MAX_STOP_TIMEOUT_S} "
                f"(Fargate's limit), got {self.stop_timeout_s}"
            )
        if self.drain_timeout_s >= self.stop_timeout_s:
            raise StageError(
                f"worker drain_timeout_s ({self.drain_timeout_s}) must be shorter than "
                f"stop_timeout_s ({self.stop_timeout_s}), or ECS kills workers mid-drain"
            )
        if not 0 <= self.tenant_concurrency_limit <= 1000:
            raise StageError(
                f"worker tenant_concurrency_limit must be 0..1000, got {self.tenant_concurrency_limit}"
            )
        if self.spot_weight < 0 or self.on_demand_base < 0:
            raise StageError("worker spot_weight and on_demand_base must be >= 0")
        if not 0 <= self.min_tasks <= self.max_tasks or self.max_tasks < 1:
            raise StageError(
                f"worker tasks need 0 <= min ({self.min_tasks}) <= max ({self.max_tasks}), max >= 1"
            )
        if self.slots < 1 or self.backlog_per_task < 1:
            raise StageError("worker slots and backlog_per_task must be at least 1")


@dataclass(frozen=True, kw_only=True)
class HealthCheckSettings:
    enabled: bool = False
    rate_minutes: int = 5
    pending_alert_after_s: int = 900
    overtime_grace_s: int = 60
    alert_channel: str = "#agentq-alerts"

    def check(self) -> None:
        if self.rate_minutes < 1:
            raise StageError(f"health check rate_minutes must be >= 1, got {self.rate_minutes}")


@dataclass(frozen=True, kw_only=True)
class ReconcilerSettings:
    enabled: bool = True
    rate_minutes: int = 5
    # Above the queue's visibility timeout (900 s) and the retry backoff cap (300 s).
    lost_after_s: int = 1800
    stall_after_s: int = 300

    def check(self) -> None:
        if self.rate_minutes < 1:
            raise StageError(f"reconciler rate_minutes must be >= 1, got {self.rate_minutes}")
        if self.lost_after_s < 900:
            raise StageError(
                f"reconciler lost_after_s ({self.lost_after_s}) must be at least the queue's "
                "visibility timeout (900 s), or every backlog gets duplicate messages"
            )


@dataclass(frozen=True, kw_only=True)
class SlackChannel:
    """A Slack channel AWS Chatbot posts alarms to: the workspace (team) id, authorized
    once in the AWS Chatbot console, and the channel id (Slack's channel details)."""

    workspace_id: str
    channel_id: str

    @classmethod
    def parse(cls, value: str) -> SlackChannel:
        """`TEAM_ID/CHANNEL_ID`, as `-c alarm_slack=` takes it."""
        workspace, _, channel = value.partition("/")
        if not workspace.strip() or not channel.strip() or "/" in channel:
            raise StageError(f"alarm_slack must be WORKSPACE_ID/CHANNEL_ID, got {value!r}")
        return cls(workspace_id=workspace.strip(), channel_id=channel.strip())


@dataclass(frozen=True, kw_only=True)
class AlarmSettings:
    period_minutes: int = 5
    oldest_message_age_s: int = 1800
    dlq_messages: int = 1  # tasks dead-lettered in one period (DLQ processor's metrics)
    # A dead letter (received or not) still in the DLQ for this many periods: the DLQ
    # processor keeps failing on it, or its task's lease stays live. Not the oldest
    # message's age: SQS leaves a message received 3+ times out of that metric.
    dlq_stuck_periods: int = 3
    lambda_errors: int = 1
    lambda_throttles: int = 1
    # Fewer worker tasks running than desired for this many periods (a deploy or a
    # scale-out needs a couple of minutes to start tasks; a crash loop never catches up).
    below_desired_periods: int = 3
    api_server_errors: int = 1
    task_failures: int = 5
    task_timeouts: int = 1
    dynamodb_throttles: int = 1  # throttled requests to a table or one of its indexes
    # Who the alarm topic reaches: e-mail addresses (each confirms once) and Slack
    # channels (AWS Chatbot). A production stage without any fails synth.
    emails: tuple[str, ...] = ()
    slack_channels: tuple[SlackChannel, ...] = ()

    @property
    def has_subscriber(self) -> bool:
        return bool(self.emails or self.slack_channels)

    def check(self) -> None:
        for email in self.emails:
            local, _, domain = email.partition("@")
            if not local or "." not in domain or any(c.isspace() for c in email):
                raise StageError(f"alarm e-mail {email!r} is not an address")
        if self.dlq_stuck_periods < 1:
            raise StageError("alarms dlq_stuck_periods must be at least 1")


@dataclass(frozen=True, kw_only=True)
class LambdaConcurrency:
    """Reserved concurrency per function (None: uncapped). A cap keeps a runaway (an
    event storm, a retry loop) from taking the account's concurrency from the producer
    API, and a scheduled sweep from overlapping itself. Reserving needs the account's
    unreserved concurrency to stay at least 100: new accounts start lower (ask for a
    quota increase, docs/deploy.md), so the dev stage reserves nothing."""

    # Event-driven from the bus: throttled events are retried by EventBridge for a day.
    save_event: int | None = None
    dispatcher: int | None = None
    # Scheduled sweeps: one at a time (a second sweep would repeat the first's repairs).
    reconciler: int | None = None
    health_check: int | None = None

    def reserved(self, name: str) -> int | None:
        value: int | None = getattr(self, name.replace("-", "_"))
        if value is not None and value < 1:
            raise StageError(f"lambda reserved concurrency for {name} must be >= 1 or None")
        return value


@dataclass(frozen=True, kw_only=True)
class StageSettings:
    name: str
    app_name: str = APP_NAME_DEFAULT
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    event_ttl_days: int = 30
    artifact_expiry_days: int = 90
    overflow_expiry_days: int = 30
    access_log_expiry_days: int = 90
    dlq_batch_size: int = 1
    api_rate_limit: int = 50
    api_burst_limit: int = 100
    # The producer API's tenancy (API_ACCOUNT_TENANT, API_TENANT_CACHE_SECONDS).
    api_account_tenant: bool = False
    api_tenant_cache_s: int = 30
    # IAM role/user ARNs that may change task definitions through the producer API
    # (API_DEFINITION_ADMINS); none: definitions change only with deploys.
    api_definition_admins: tuple[str, ...] = ()
    lambda_memory_mib: int = 512
    # Stateful resources (tables, queues) go with the stack in dev; prod keeps them.
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    health_check: HealthCheckSettings = field(default_factory=HealthCheckSettings)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    alarms: AlarmSettings = field(default_factory=AlarmSettings)
    lambda_concurrency: LambdaConcurrency = field(default_factory=LambdaConcurrency)
    # Definition directories the deployment loads into the definitions table (relative
    # paths are from the repository root, where cdk runs); see docs/deploy.md.
    definitions: tuple[Path, ...] = SAMPLE_DEFINITIONS

    def __post_init__(self) -> None:
        if not self.name.isalnum() or not self.name.islower():
            raise StageError(f"stage name must be lowercase letters/digits, got {self.name!r}")
        if len(set(self.definitions)) != len(self.definitions):
            raise StageError("a definitions directory is named twice")
        self.worker.check()
        self.health_check.check()
        self.reconciler.check()
        self.alarms.check()

    def check_alarm_subscribers(self) -> None:
        """A production stage's alarms must reach someone; a dev stage's may not."""
        if self.is_production and not self.alarms.has_subscriber:
            raise StageError(
                f"stage {self.name}: no alarm subscriber; the alarm topic would reach "
                "nobody. Pass -c alarm_emails=you@example.com (comma-separated) and/or "
                "-c alarm_slack=WORKSPACE_ID/CHANNEL_ID (make deploy ALARM_EMAILS=... "
                "ALARM_SLACK=...), or set them in infra/stages.py"
            )

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(stage=self.name, app_name=self.app_name)

    @property
    def is_production(self) -> bool:
        return self.removal_policy is RemovalPolicy.RETAIN


STAGES: Final[dict[str, StageSettings]] = {
    "dev": StageSettings(
        name="dev",
        log_retention=logs.RetentionDays.TWO_WEEKS,
        event_ttl_days=14,
        # A sandbox runs on Spot: interruptions only cost a retry there.
        worker=WorkerSettings(min_tasks=0, max_tasks=2, slots=2, nat_gateways=1, spot_weight=1),
        # Off in dev like the seed's `enabled: false`: nobody wants pages from a sandbox.
        health_check=HealthCheckSettings(
            enabled=False, rate_minutes=60, alert_channel="#agentq-dev"
        ),
        # On in dev too: it repairs, it does not page.
        reconciler=ReconcilerSettings(rate_minutes=15),
        alarms=AlarmSettings(task_failures=20, oldest_message_age_s=3600),
    ),
    "prod": StageSettings(
        name="prod",
        log_retention=logs.RetentionDays.THREE_MONTHS,
        event_ttl_days=90,
        removal_policy=RemovalPolicy.RETAIN,
        api_rate_limit=200,
        api_burst_limit=400,
        worker=WorkerSettings(
            min_tasks=1, max_tasks=10, slots=3, backlog_per_task=3, nat_gateways=2
        ),
        health_check=HealthCheckSettings(
            enabled=True, rate_minutes=5, alert_channel="#agentq-alerts"
        ),
        alarms=AlarmSettings(task_failures=5, oldest_message_age_s=1800),
        lambda_concurrency=LambdaConcurrency(
            save_event=50, dispatcher=20, reconciler=1, health_check=1
        ),
    ),
}


def stage_settings(
    name: str,
    *,
    app_name: str | None = None,
    definitions: Sequence[Path] = (),
    alarm_emails: Sequence[str] = (),
    alarm_slack: Sequence[str] = (),
) -> StageSettings:
    """The settings of a known stage; `app_name` renames every resource of it,
    `definitions` ships more definition directories (`make deploy DEFINITIONS=...`) and
    `alarm_emails` / `alarm_slack` (WORKSPACE_ID/CHANNEL_ID) add alarm subscribers."""
    try:
        settings = STAGES[name]
    except KeyError:
        known = ", ".join(sorted(STAGES))
        raise StageError(f"unknown stage {name!r}; known stages: {known}") from None
    if app_name:
        settings = replace(settings, app_name=app_name)
    if alarm_emails or alarm_slack:
        alarms = settings.alarms
        emails = alarms.emails + tuple(e for e in alarm_emails if e not in alarms.emails)
        slack = alarms.slack_channels + tuple(SlackChannel.parse(c) for c in alarm_slack)
        alarms = replace(alarms, emails=emails, slack_channels=slack)
        settings = replace(settings, alarms=alarms)
    extra = tuple(Path(d) for d in definitions if Path(d) not in settings.definitions)
    return replace(settings, definitions=settings.definitions + extra) if extra else settings
