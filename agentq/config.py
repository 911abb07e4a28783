"""agentq's configuration: every environment variable, read in one typed place.

`Settings.from_env()` parses everything once; components then `require()` the AWS
resource names they need, which raises `ConfigError` naming the variable when it is
missing. There are no silent defaults for resource names: the local stack exports
real names and URLs into the environment like a deployment would.

Each setting is a pydantic field: its type, its allowed range or choices, and the
variable it is read from. A bad value fails with `ConfigError` naming the variable
and what it allows. `python -m agentq.config_doc` writes the reference table of
docs/configuration.md from these fields; `python -m agentq.config` prints it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Literal, Self

from pydantic import ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agentq.config_fields import (
    DAY_MS,
    NAME,
    URL,
    Choice,
    Environment,
    Flag,
    Float,
    Int,
    Level,
    allowed,
    config_error,
    var,
)
from agentq.errors import ConfigError

# When a worker's warm spares import the Claude SDK (see worker/spares.py).
WarmAgent = Literal["recent", "always", "never"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
# How the worker's receiver picks a priority tier (worker/scheduler.py).
SchedulerMode = Literal["strict", "weighted", "round-robin"]
_TIER: Final = r"[a-z][a-z0-9-]{0,31}"
_URL_LIST_PATTERN: Final = rf"^{_TIER}=\S+(,{_TIER}=\S+)*$"
_WEIGHT_LIST_PATTERN: Final = rf"^{_TIER}=[0-9.]+(,{_TIER}=[0-9.]+)*$"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        case_sensitive=True,
    )

    # -- where things are ------------------------------------------------------------
    local: Flag = var(
        "AGENTQ_LOCAL",
        False,
        "Running against the embedded local stack (moto + offline model server).",
        "all",
    )
    local_iam: Annotated[Literal["off", "enforce"], Choice] = var(
        "AGENTQ_LOCAL_IAM", "off",
        "Local stack only: `enforce` runs moto with IAM checked, each component signing "
        "with exactly its synthesized policy (docs/least-privilege.md).",
        "local stack",
    )  # fmt: skip
    stage: str = var(
        "AGENTQ_STAGE", "dev", "Deployment stage name (dev, prod, ...).", "all", **NAME
    )
    region: str = var(
        "AWS_REGION", "eu-west-1",
        "AWS region for every client; unset: AWS_DEFAULT_REGION, then the profile's region.",
        "all", min_length=1,
        max_length=32, pattern=r"^[a-z0-9-]+$",
    )  # fmt: skip
    app_name: str = var(
        "APP_NAME", "agentq", "EventBridge `source` of every event; index prefix.", "all",
        min_length=1, max_length=64, pattern=r"^\S+$",
    )  # fmt: skip
    tenant_id: str = var(
        "TENANT_ID", "default", "Tenant used when a task names none.", "worker, client", **NAME
    )
    queue_url: str | None = var(
        "SQS_QUEUE_URL", None, "Task queue URL (required).", "worker, client, dispatcher", **URL
    )
    queue_urls: str | None = var(
        "SQS_QUEUE_URLS", None,
        "Priority tier queues as `tier=url,...`; a tier not named here uses "
        "SQS_QUEUE_URL (so a single-queue setup needs only that).",
        "worker, client, dispatcher, API", min_length=1, max_length=16_384,
        pattern=_URL_LIST_PATTERN,
    )  # fmt: skip
    priorities_list: str = var(
        "PRIORITIES", "high,normal,low",
        "Priority tiers, highest first (each its own SQS queue; see docs/scheduling.md).",
        "worker, client, dispatcher, API", min_length=1, max_length=330,
        pattern=rf"^{_TIER}(,{_TIER}){{0,9}}$",
    )  # fmt: skip
    default_priority: str = var(
        "DEFAULT_PRIORITY", "normal",
        "Tier of a task whose producer, job and definition name none; its queue is "
        "SQS_QUEUE_URL unless SQS_QUEUE_URLS names it.",
        "worker, client, dispatcher, API", min_length=1, max_length=32, pattern=rf"^{_TIER}$",
    )  # fmt: skip
    dlq_url: str | None = var(
        "SQS_DLQ_URL", None, "Dead-letter queue URL.", "health-check, CLI `dlq`", **URL
    )
    table_name: str | None = var(
        "DYNAMODB_EVENTS_TABLE_NAME",
        None,
        "Events table: STATE items (the lock), events, jobs (required).",
        "all",
        **NAME,
    )
    definitions_table: str | None = var(
        "TASK_DEFINITIONS_TABLE",
        None,
        "Task-definitions table (optional; definitions may come from a directory).",
        "worker, client, API",
        **NAME,
    )
    definitions_dir: str | None = var(
        "TASK_DEFINITIONS_DIR",
        None,
        "Directories of task definition files (*.yaml, *.json), separated like PATH.",
        "worker, client",
        min_length=1,
        max_length=16_384,
    )
    bus_name: str | None = var(
        "EVENTBRIDGE_BUS_NAME", None, "Event bus for every agentq event (required).", "all",
        **NAME,
    )  # fmt: skip
    bucket: str | None = var(
        "S3_BUCKET", None, "Artifacts, event overflow and DLQ archive bucket (required).", "all",
        min_length=1, max_length=63,
    )  # fmt: skip
    # -- receiving and leases --------------------------------------------------------
    wait_time_seconds: Int = var(
        "WAIT_TIME_SECONDS", 20, "SQS long-poll wait.", "worker", ge=0, le=20
    )
    visibility_timeout: Int = var(
        "VISIBILITY_TIMEOUT", 900, "Queue visibility timeout (s) set by the stacks.", "infra",
        ge=0, le=43_200,
    )  # fmt: skip
    extension_interval_ms: Int = var(
        "VISIBILITY_EXTENSION_INTERVAL",
        20_000,
        "Heartbeat interval (ms): visibility extension, lease renewal, heartbeat event. "
        "Shorter than VISIBILITY_EXTENSION_AMOUNT and VISIBILITY_TIMEOUT.",
        "worker",
        ge=50,
        le=43_200_000,
    )
    extension_amount_s: Int = var(
        "VISIBILITY_EXTENSION_AMOUNT",
        30,
        "Visibility extension per heartbeat (s); the lease lasts 1.5x this.",
        "worker",
        ge=1,
        le=43_200,
    )
    liveness_file: str | None = var(
        "LIVENESS_FILE", None,
        "File the heartbeat loop touches every beat; the container health check fails "
        "when it is older than 3 heartbeat intervals (min 60 s). Unset: not written.",
        "worker", min_length=1, max_length=4096,
    )  # fmt: skip
    max_concurrent: Int = var(
        "MAX_CONCURRENT_CLAUDE", 3, "Task slots per worker process.", "worker", ge=1, le=1024
    )
    prefetch_horizon_ms: Int = var(
        "PREFETCH_HORIZON",
        2_000,
        "Prefetch (ms): a receive also takes the messages this worker expects to start "
        "within this time at its recent rate (0: only free slots).",
        "worker",
        ge=0,
        le=600_000,
    )
    scheduler_mode: Annotated[SchedulerMode, Choice] = var(
        "SCHEDULER_MODE", "weighted",
        "How a worker picks the tier to receive from when a slot frees: `strict` "
        "(highest tier with work), `weighted` (seed 004's score, with the starvation "
        "bound) or `round-robin`.",
        "worker",
    )  # fmt: skip
    starvation_bound_ms: Int = var(
        "SCHEDULER_STARVATION_BOUND", 30_000,
        "Weighted mode: a tier with work not received from for this long (ms) goes next.",
        "worker", ge=100, le=DAY_MS,
    )  # fmt: skip
    backlog_refresh_ms: Int = var(
        "SCHEDULER_BACKLOG_REFRESH", 10_000,
        "At most how often (ms) a worker asks the tier queues for their backlog "
        "(GetQueueAttributes); between refreshes receives estimate it (0: never ask).",
        "worker", ge=0, le=DAY_MS,
    )  # fmt: skip
    probe_interval_ms: Int = var(
        "SCHEDULER_PROBE_INTERVAL", 1_000,
        "A tier found empty is checked again (a short poll) after this long (ms).",
        "worker", ge=50, le=600_000,
    )  # fmt: skip
    priority_weights: str | None = var(
        "PRIORITY_WEIGHTS", None,
        "Weighted mode: queue weights as `tier=weight,...` (default 1.0, 0.75, 0.5, "
        "then 0.25, by rank).",
        "worker", min_length=1, max_length=1024, pattern=_WEIGHT_LIST_PATTERN,
    )  # fmt: skip
    event_batch_window_ms: Int = var(
        "EVENT_BATCH_WINDOW",
        1_000,
        "How long (ms) a task event may wait for companions before its PutEvents call "
        "(sent at once when 10 are ready).",
        "worker",
        ge=0,
        le=60_000,
    )
    sqs_batch_window_ms: Int = var(
        "SQS_BATCH_WINDOW",
        500,
        "How long (ms) a delete or visibility change may wait for companions before its "
        "batch call (sent at once when 10 are ready).",
        "worker",
        ge=0,
        le=60_000,
    )
    max_message_retries: Int = var(
        "MAX_MESSAGE_RETRIES",
        3,
        "Attempts per task (counted on the STATE item) before a terminal failure.",
        "worker",
        ge=1,
        le=100,
    )
    retry_backoff_base_s: Float = var(
        "RETRY_BACKOFF_BASE",
        5.0,
        "Base (s) of the jittered exponential retry backoff (at most RETRY_BACKOFF_MAX).",
        "worker",
        ge=0,
        le=43_200,
    )
    retry_backoff_max_s: Float = var(
        "RETRY_BACKOFF_MAX", 300.0, "Cap (s) of the retry backoff.", "worker", ge=0, le=43_200
    )
    max_message_delay_s: Int = var(
        "MAX_MESSAGE_DELAY", 900,
        "Longest delay (s) a delayed task's message gets from SQS DelaySeconds; the rest "
        "is waited out by re-delaying an early message through its visibility.",
        "client, dispatcher", ge=0, le=900,
    )  # fmt: skip
    max_redelay_s: Int = var(
        "MAX_REDELAY", 43_200,
        "Longest visibility (s) a worker gives a message received before its task is "
        "due; a longer wait is several re-delays. SQS allows at most 12 hours.",
        "worker", ge=1, le=43_200,
    )  # fmt: skip
    drain_timeout_ms: Int = var(
        "DRAIN_TIMEOUT",
        120_000,
        "On SIGTERM, how long (ms) running tasks may finish before they are stopped.",
        "worker",
        ge=0,
        le=DAY_MS,
    )
    worker_id: str | None = var(
        "WORKER_ID", None, "Worker identity in leases and events (default host:pid).", "worker",
        **NAME,
    )  # fmt: skip
    # -- the child and Claude ----------------------------------------------------------
    task_timeout_ms: Int = var(
        "CLAUDE_TIMEOUT",
        200_000,
        "Child process timeout (ms) when the definition sets none.",
        "worker",
        ge=100,
        le=DAY_MS,
    )
    kill_grace_ms: Int = var(
        "CLAUDE_KILL_GRACE", 5_000, "SIGTERM → SIGKILL grace (ms).", "worker", ge=0, le=600_000
    )
    warm_children: Flag = var(
        "WARM_CHILDREN",
        True,
        "Keep pre-started child processes ready for the next tasks.",
        "worker",
    )
    warm_agent: Annotated[WarmAgent, Choice] = var(
        "WARM_AGENT",
        "recent",
        "When warm children import the Claude SDK: `recent` (an agent task started in "
        "the last 10 minutes), `always` (workers that run agent tasks), `never`.",
        "worker",
    )
    model: str = var(
        "CLAUDE_MODEL", "claude-opus-4-5", "Default model of agent tasks.", "child", **NAME
    )
    step_timeout_ms: Int = var(
        "DEFAULT_TIMEOUT",
        300_000,
        "Default SDK step timeout (ms), clamped to 1 s to 15 min.",
        "child",
        ge=1,
        le=DAY_MS,
    )
    work_dir: str | None = var(
        "AGENTQ_WORK_DIR", None, "Parent of per-task temp dirs (default: system temp).",
        "worker", min_length=1, max_length=4096,
    )  # fmt: skip
    child_user: str | None = var(
        "CHILD_USER", None,
        "Unprivileged user the task child runs as; needs a worker running as root "
        "(default: the worker's own user). See docs/security.md.",
        "worker", min_length=1, max_length=32,
    )  # fmt: skip
    delete_files_after_upload: Flag = var(
        "DELETE_FILES_AFTER_UPLOAD", True, "Remove a task's local files after upload.", "worker"
    )
    # -- events ----------------------------------------------------------------------
    event_ttl_days: Int = var(
        "EVENT_TTL_DAYS", 30, "Days an event item lives in the table (0 = forever).",
        "save-event", ge=0, le=36_500,
    )  # fmt: skip
    persist_heartbeats: Flag = var(
        "PERSIST_HEARTBEATS", False, "Store `Task Heartbeat` events in the timeline.", "save-event"
    )
    dlq_batch_size: Int = var(
        "DLQ_BATCH_SIZE",
        10,
        "Messages per dlq-processor invocation (event source batch size; local host too).",
        "dlq-processor, infra",
        ge=1,
        le=10_000,
    )
    # -- health check ----------------------------------------------------------------
    health_check_interval_s: Int = var(
        "HEALTH_CHECK_INTERVAL",
        300,
        "Seconds between health checks run by the local Lambda host (0 = off).",
        "local host",
        ge=0,
        le=86_400,
    )
    alert_dedupe_days: Int = var(
        "ALERT_DEDUPE_DAYS",
        14,
        "Days an alert marker keeps the same task and condition from alerting again.",
        "health",
        ge=1,
        le=365,
    )
    pending_alert_after_s: Int = var(
        "PENDING_ALERT_AFTER", 900, "A PENDING task older than this (s) is starving.", "health",
        ge=0, le=604_800,
    )  # fmt: skip
    overtime_grace_s: Int = var(
        "OVERTIME_GRACE", 60, "Grace (s) past a task's timeout before it is overtime.",
        "health", ge=0, le=86_400,
    )  # fmt: skip
    slack_token: str | None = var(
        "SLACK_BOT_TOKEN", None, "Slack bot token (or use the secret ARN).", "health",
        secret=True, **NAME,
    )  # fmt: skip
    slack_token_secret_arn: str | None = var(
        "SLACK_TOKEN_SECRET_ARN", None, "Secrets Manager secret holding the token.", "health",
        **URL,
    )  # fmt: skip
    alert_channel: str | None = var(
        "ALERT_CHANNEL", None, "Slack channel for alerts.", "health", **NAME
    )
    slack_api_url: str | None = var(
        "SLACK_API_URL", None, "Slack Web API base URL (tests point it at a stand-in).",
        "health", **URL,
    )  # fmt: skip
    # -- reconciler ------------------------------------------------------------------
    reconcile_interval_s: Int = var(
        "RECONCILE_INTERVAL", 60,
        "Seconds between reconciler runs by the local Lambda host (0 = off).",
        "local host", ge=0, le=86_400,
    )  # fmt: skip
    reconcile_lost_after_s: Int = var(
        "RECONCILE_LOST_AFTER", 1800,
        "A PENDING/RETRYING task due, or a PROCESSING lease lapsed, longer than this (s) "
        "has lost its message and is sent again. Keep it above the queue's visibility "
        "timeout and the retry backoff cap, or healthy backlogs get duplicate messages.",
        "reconciler", ge=1, le=604_800,
    )  # fmt: skip
    reconcile_stall_after_s: Int = var(
        "RECONCILE_STALL_AFTER", 300,
        "A running job whose last task change is older than this (s) and that the "
        "dispatcher should have moved on (uncounted terminal task, BLOCKED task with "
        "finished dependencies, every task counted) is moved on by the reconciler.",
        "reconciler", ge=1, le=604_800,
    )  # fmt: skip
    # -- runtime ---------------------------------------------------------------------
    ecs_agent_uri: str | None = var(
        "ECS_AGENT_URI", None, "Set by ECS; enables task scale-in protection.", "worker", **URL
    )
    log_level: Annotated[LogLevel, Level] = var("LOG_LEVEL", "INFO", "Log level.", "all")
    clock_offset_ms: Int = var(
        "AGENTQ_TEST_CLOCK_OFFSET_MS", 0,
        "TEST ONLY: shifts this process's agentq clock (`agentq.events.now_ms`: leases, "
        "locks, retry times) by this many ms, to play a host with a skewed clock (the "
        "chaos harness's --faults mode). Never set it in a deployment.",
        "chaos harness", ge=-60_000, le=60_000,
    )  # fmt: skip

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `Settings(...)` is the defaults plus what the caller passes, as it always was;
        # the environment is read only by `from_env`, from the mapping it is given.
        return (init_settings,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values = Environment(cls, env)()
        if "region" not in values:
            values["region"] = _fallback_region(env)
        try:
            return cls(**values)
        except ValidationError as exc:
            raise config_error(cls, exc, values) from None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.extension_interval_ms >= self.extension_amount_s * 1000:
            raise ConfigError(
                "VISIBILITY_EXTENSION_INTERVAL",
                "must be shorter than VISIBILITY_EXTENSION_AMOUNT, or a lease expires "
                "between two heartbeats",
            )
        if self.extension_interval_ms >= self.visibility_timeout * 1000 > 0:
            raise ConfigError(
                "VISIBILITY_EXTENSION_INTERVAL",
                "must be shorter than VISIBILITY_TIMEOUT, or a running task's message "
                "becomes visible between two heartbeats",
            )
        if self.default_priority not in self.priorities:
            raise ConfigError(
                "DEFAULT_PRIORITY", f"must be one of PRIORITIES ({self.priorities_list})"
            )
        for tier in (*_pairs(self.queue_urls), *_pairs(self.priority_weights)):
            if tier not in self.priorities:
                raise ConfigError(
                    "SQS_QUEUE_URLS" if tier in _pairs(self.queue_urls) else "PRIORITY_WEIGHTS",
                    f"names tier {tier!r}, not one of PRIORITIES ({self.priorities_list})",
                )
        for name, weight in _pairs(self.priority_weights).items():
            try:
                if not 0 < float(weight) <= 1000:
                    raise ValueError(weight)
            except ValueError:
                raise ConfigError(
                    "PRIORITY_WEIGHTS", f"{name}: a weight is a number in (0, 1000]"
                ) from None
        if self.retry_backoff_base_s > self.retry_backoff_max_s:
            raise ConfigError("RETRY_BACKOFF_BASE", "must not exceed RETRY_BACKOFF_MAX")
        return self

    def require(self, *attributes: str) -> Settings:
        """Fail fast, naming the environment variable, when a needed setting is absent."""
        missing = [env_name(a) for a in attributes if getattr(self, a) in (None, "")]
        if missing:
            raise ConfigError(
                missing[0],
                "is required"
                + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""),
            )
        return self

    def required(self, attribute: str) -> str:
        value = getattr(self.require(attribute), attribute)
        assert isinstance(value, str)
        return value

    @property
    def priorities(self) -> tuple[str, ...]:
        """Priority tiers, highest first."""
        return tuple(self.priorities_list.split(","))

    def tier_queue_urls(self) -> dict[str, str]:
        """Each tier's queue URL, highest first; tiers without one of their own share
        SQS_QUEUE_URL (which is the default tier's when SQS_QUEUE_URLS leaves it out)."""
        named = _pairs(self.queue_urls)
        fallback = self.queue_url or named.get(self.default_priority)
        urls = {tier: named.get(tier) or fallback for tier in self.priorities}
        return {tier: url for tier, url in urls.items() if url}

    def tier_weights(self) -> dict[str, float]:
        return {tier: float(weight) for tier, weight in _pairs(self.priority_weights).items()}

    @property
    def definitions_dirs(self) -> list[Path]:
        """TASK_DEFINITIONS_DIR may list several directories, separated like PATH."""
        return [Path(p) for p in (self.definitions_dir or "").split(os.pathsep) if p]

    @property
    def lease_seconds(self) -> float:
        """How long a lock or heartbeat keeps a task: 1.5x the extension, so a message that
        reappears after a crash still finds the lease live. The clock-skew budget is
        worker/leasefile.py's `skew_budget` (2 s at the defaults), not this margin."""
        return self.extension_amount_s * 1.5


@functools.cache
def clock_offset_ms() -> int:
    """AGENTQ_TEST_CLOCK_OFFSET_MS, read once per process (`now_ms` is a hot path)."""
    raw = os.environ.get("AGENTQ_TEST_CLOCK_OFFSET_MS", "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            "AGENTQ_TEST_CLOCK_OFFSET_MS", f"expected an integer, got {raw!r}"
        ) from None


def _fallback_region(env: Mapping[str, str]) -> str:
    """Without AWS_REGION, the region boto3 itself would use: AWS_DEFAULT_REGION, then
    the profile's; eu-west-1 only when neither names one."""
    if env.get("AWS_DEFAULT_REGION"):
        return env["AWS_DEFAULT_REGION"]
    import botocore.session

    profile = env.get("AWS_PROFILE")
    try:
        region = botocore.session.Session(profile=profile).get_config_variable("region")
    except Exception:  # a broken or missing profile: the variables decide, as before
        region = None
    return str(region) if region else "eu-west-1"


def env_names() -> frozenset[str]:
    """Every variable a setting is read from."""
    return frozenset(str(field.validation_alias) for field in Settings.model_fields.values())


def _pairs(value: str | None) -> dict[str, str]:
    """`a=x,b=y` (already checked against its pattern) as a mapping."""
    if not value:
        return {}
    return dict(pair.split("=", 1) for pair in value.split(","))


def env_name(attribute: str) -> str:
    field = Settings.model_fields.get(attribute)
    if field is None:
        raise KeyError(attribute)
    return str(field.validation_alias)


def reference_table() -> str:
    """The Markdown table of docs/configuration.md."""
    lines = [
        "| variable | default | allowed | used by | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in Settings.model_fields.values():
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        default = "—" if field.default is None else f"`{field.default}`"
        lines.append(
            f"| `{field.validation_alias}` | {default} | {allowed(field)} "
            f"| {extra['readers']} | {field.description} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_table())
