"""agentq's configuration: every environment variable, read in one typed place.

`Settings.from_env()` parses everything once; components then `require()` the AWS
resource names they need, which raises `ConfigError` naming the variable when it is
missing. There are no silent defaults for resource names: the local stack exports
real names and URLs into the environment like a deployment would.

`python -m agentq.config` prints the reference table kept in docs/configuration.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args

from agentq.errors import ConfigError

T = TypeVar("T")

# When a worker's warm spares import the Claude SDK (see worker/spares.py).
WarmAgent = Literal["recent", "always", "never"]

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(name, f"expected true/false, got {raw!r}")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {raw!r}") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(name, f"expected a number, got {raw!r}") from None


def _var(
    env: str,
    default: Any,
    doc: str,
    readers: str,
    *,
    minimum: float | None = None,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
) -> Any:
    """Declare a setting; the metadata drives parsing and the docs table."""
    from dataclasses import field

    return field(
        default=default,
        repr=not secret,
        metadata={
            "env": env,
            "doc": doc,
            "readers": readers,
            "minimum": minimum,
            "choices": choices,
            "secret": secret,
        },
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    # -- where things are ------------------------------------------------------------
    local: bool = _var(
        "AGENTQ_LOCAL",
        False,
        "Running against the embedded local stack (moto + offline model server).",
        "all",
    )
    stage: str = _var("AGENTQ_STAGE", "dev", "Deployment stage name (dev, prod, ...).", "all")
    region: str = _var("AWS_REGION", "eu-west-1", "AWS region for every client.", "all")
    app_name: str = _var(
        "APP_NAME", "agentq", "EventBridge `source` of every event; index prefix.", "all"
    )
    tenant_id: str = _var(
        "TENANT_ID", "default", "Tenant used when a task names none.", "worker, client"
    )
    queue_url: str | None = _var(
        "SQS_QUEUE_URL", None, "Task queue URL (required).", "worker, client, dispatcher"
    )
    dlq_url: str | None = _var(
        "SQS_DLQ_URL", None, "Dead-letter queue URL.", "health-check, CLI `dlq`"
    )
    table_name: str | None = _var(
        "DYNAMODB_EVENTS_TABLE_NAME",
        None,
        "Events table: STATE items (the lock), events, jobs (required).",
        "all",
    )
    definitions_table: str | None = _var(
        "TASK_DEFINITIONS_TABLE",
        None,
        "Task-definitions table (optional; definitions may come from a directory).",
        "worker, client, API",
    )
    definitions_dir: str | None = _var(
        "TASK_DEFINITIONS_DIR",
        None,
        "Directories of task definition files (*.yaml, *.json), separated like PATH.",
        "worker, client",
    )
    bus_name: str | None = _var(
        "EVENTBRIDGE_BUS_NAME", None, "Event bus for every agentq event (required).", "all"
    )
    bucket: str | None = _var(
        "S3_BUCKET", None, "Artifacts, event overflow and DLQ archive bucket (required).", "all"
    )
    # -- receiving and leases --------------------------------------------------------
    wait_time_seconds: int = _var(
        "WAIT_TIME_SECONDS", 20, "SQS long-poll wait.", "worker", minimum=0
    )
    visibility_timeout: int = _var(
        "VISIBILITY_TIMEOUT", 900, "Queue visibility timeout (s) set by the stacks.", "infra"
    )
    extension_interval_ms: int = _var(
        "VISIBILITY_EXTENSION_INTERVAL",
        20_000,
        "Heartbeat interval (ms): visibility extension, lease renewal, heartbeat event.",
        "worker",
        minimum=50,
    )
    extension_amount_s: int = _var(
        "VISIBILITY_EXTENSION_AMOUNT",
        30,
        "Visibility extension per heartbeat (s); the lease lasts 1.5x this.",
        "worker",
        minimum=1,
    )
    max_concurrent: int = _var(
        "MAX_CONCURRENT_CLAUDE", 3, "Task slots per worker process.", "worker", minimum=1
    )
    prefetch_horizon_ms: int = _var(
        "PREFETCH_HORIZON",
        2_000,
        "Prefetch (ms): a receive also takes the messages this worker expects to start "
        "within this time at its recent rate (0: only free slots).",
        "worker",
        minimum=0,
    )
    event_batch_window_ms: int = _var(
        "EVENT_BATCH_WINDOW",
        1_000,
        "How long (ms) a task event may wait for companions before its PutEvents call "
        "(sent at once when 10 are ready).",
        "worker",
        minimum=0,
    )
    sqs_batch_window_ms: int = _var(
        "SQS_BATCH_WINDOW",
        500,
        "How long (ms) a delete or visibility change may wait for companions before its "
        "batch call (sent at once when 10 are ready).",
        "worker",
        minimum=0,
    )
    max_message_retries: int = _var(
        "MAX_MESSAGE_RETRIES",
        3,
        "Attempts per task (counted on the STATE item) before a terminal failure.",
        "worker",
        minimum=1,
    )
    retry_backoff_base_s: float = _var(
        "RETRY_BACKOFF_BASE", 5.0, "Base (s) of the jittered exponential retry backoff.", "worker"
    )
    retry_backoff_max_s: float = _var(
        "RETRY_BACKOFF_MAX", 300.0, "Cap (s) of the retry backoff.", "worker"
    )
    drain_timeout_ms: int = _var(
        "DRAIN_TIMEOUT",
        120_000,
        "On SIGTERM, how long (ms) running tasks may finish before they are stopped.",
        "worker",
    )
    worker_id: str | None = _var(
        "WORKER_ID", None, "Worker identity in leases and events (default host:pid).", "worker"
    )
    # -- the child and Claude ----------------------------------------------------------
    task_timeout_ms: int = _var(
        "CLAUDE_TIMEOUT",
        200_000,
        "Child process timeout (ms) when the definition sets none.",
        "worker",
        minimum=100,
    )
    kill_grace_ms: int = _var(
        "CLAUDE_KILL_GRACE", 5_000, "SIGTERM → SIGKILL grace (ms).", "worker", minimum=0
    )
    warm_children: bool = _var(
        "WARM_CHILDREN",
        True,
        "Keep pre-started child processes ready for the next tasks.",
        "worker",
    )
    # (RUF009: ruff cannot tell that a Literal alias is immutable; `_var` is a field().)
    warm_agent: WarmAgent = _var(  # noqa: RUF009
        "WARM_AGENT",
        "recent",
        "When warm children import the Claude SDK: `recent` (an agent task started in "
        "the last 10 minutes), `always` (workers that run agent tasks), `never`.",
        "worker",
        choices=get_args(WarmAgent),
    )
    model: str = _var("CLAUDE_MODEL", "claude-opus-4-5", "Default model of agent tasks.", "child")
    step_timeout_ms: int = _var(
        "DEFAULT_TIMEOUT",
        300_000,
        "Default SDK step timeout (ms), clamped to 1 s to 15 min.",
        "child",
    )
    work_dir: str | None = _var(
        "AGENTQ_WORK_DIR", None, "Parent of per-task temp dirs (default: system temp).", "worker"
    )
    child_user: str | None = _var(
        "CHILD_USER",
        None,
        "Unprivileged user the task child runs as; needs a worker running as root "
        "(default: the worker's own user). See docs/security.md.",
        "worker",
    )
    delete_files_after_upload: bool = _var(
        "DELETE_FILES_AFTER_UPLOAD", True, "Remove a task's local files after upload.", "worker"
    )
    # -- events ----------------------------------------------------------------------
    event_ttl_days: int = _var(
        "EVENT_TTL_DAYS", 30, "Days an event item lives in the table (0 = forever).", "save-event"
    )
    persist_heartbeats: bool = _var(
        "PERSIST_HEARTBEATS", False, "Store `Task Heartbeat` events in the timeline.", "save-event"
    )
    dlq_batch_size: int = _var(
        "DLQ_BATCH_SIZE",
        10,
        "Messages per dlq-processor invocation (event source batch size; local host too).",
        "dlq-processor, infra",
        minimum=1,
    )
    # -- health check ----------------------------------------------------------------
    health_check_interval_s: int = _var(
        "HEALTH_CHECK_INTERVAL",
        300,
        "Seconds between health checks run by the local Lambda host (0 = off).",
        "local host",
        minimum=0,
    )
    alert_dedupe_days: int = _var(
        "ALERT_DEDUPE_DAYS",
        14,
        "Days an alert marker keeps the same task and condition from alerting again.",
        "health",
        minimum=1,
    )
    pending_alert_after_s: int = _var(
        "PENDING_ALERT_AFTER", 900, "A PENDING task older than this (s) is starving.", "health"
    )
    overtime_grace_s: int = _var(
        "OVERTIME_GRACE", 60, "Grace (s) past a task's timeout before it is overtime.", "health"
    )
    slack_token: str | None = _var(
        "SLACK_BOT_TOKEN", None, "Slack bot token (or use the secret ARN).", "health", secret=True
    )
    slack_token_secret_arn: str | None = _var(
        "SLACK_TOKEN_SECRET_ARN", None, "Secrets Manager secret holding the token.", "health"
    )
    alert_channel: str | None = _var("ALERT_CHANNEL", None, "Slack channel for alerts.", "health")
    slack_api_url: str | None = _var(
        "SLACK_API_URL", None, "Slack Web API base URL (tests point it at a stand-in).", "health"
    )
    # -- runtime ---------------------------------------------------------------------
    ecs_agent_uri: str | None = _var(
        "ECS_AGENT_URI", None, "Set by ECS; enables task scale-in protection.", "worker"
    )
    log_level: str = _var("LOG_LEVEL", "INFO", "Log level.", "all")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata["env"]
            raw = env.get(name)
            if raw is None or (raw == "" and f.default is None):
                continue
            values[f.name] = _coerce(name, raw, f.default, f.metadata)
        settings = cls(**values)
        settings._check()
        return settings

    def _check(self) -> None:
        if self.extension_interval_ms >= self.extension_amount_s * 1000:
            raise ConfigError(
                "VISIBILITY_EXTENSION_INTERVAL",
                "must be shorter than VISIBILITY_EXTENSION_AMOUNT, or a lease expires "
                "between two heartbeats",
            )

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
    def definitions_dirs(self) -> list[Path]:
        """TASK_DEFINITIONS_DIR may list several directories, separated like PATH."""
        return [Path(p) for p in (self.definitions_dir or "").split(os.pathsep) if p]

    @property
    def lease_seconds(self) -> float:
        """How long a lock or heartbeat keeps a task: 1.5x the extension covers clock skew."""
        return self.extension_amount_s * 1.5


def env_name(attribute: str) -> str:
    for f in fields(Settings):
        if f.name == attribute:
            return str(f.metadata["env"])
    raise KeyError(attribute)


def _coerce(name: str, raw: str, default: Any, metadata: Mapping[str, Any]) -> Any:
    choices, minimum = metadata["choices"], metadata["minimum"]
    if choices is not None:
        if raw.strip() not in choices:
            raise ConfigError(name, f"expected one of {', '.join(choices)}, got {raw!r}")
        return raw.strip()
    parser: Callable[[str, str], Any]
    if isinstance(default, bool):
        parser = _parse_bool
    elif isinstance(default, int):
        parser = _parse_int
    elif isinstance(default, float):
        parser = _parse_float
    else:
        return raw
    value = parser(name, raw)
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"must be at least {minimum:g}, got {value}")
    return value


def reference_table() -> str:
    """The Markdown table of docs/configuration.md."""
    lines = ["| variable | default | used by | meaning |", "|---|---|---|---|"]
    for f in fields(Settings):
        default = "—" if f.default is None else f"`{f.default}`"
        lines.append(
            f"| `{f.metadata['env']}` | {default} | {f.metadata['readers']} | {f.metadata['doc']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_table())
