"""Settings of the services around the worker: events, the health check, the reconciler,
the producer API and the runtime the process finds itself in.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic_settings import BaseSettings

from agentq.config.fields import NAME, URL, Flag, Int, Level, var

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class Events(BaseSettings):
    """Event storage and the dead-letter processor; a base of `agentq.config.Settings`."""

    event_ttl_days: Int = var(
        "EVENT_TTL_DAYS", 30, "Days an event item lives in the table (0 = forever).",
        "save-event", ge=0, le=36_500,
    )  # fmt: skip
    persist_heartbeats: Flag = var(
        "PERSIST_HEARTBEATS", False,
        "Store `Task Heartbeat` events that reach save-event (its bus rule routes none).",
        "save-event",
    )  # fmt: skip
    dlq_batch_size: Int = var(
        "DLQ_BATCH_SIZE",
        10,
        "Messages per dlq-processor invocation (event source batch size; local host too).",
        "dlq-processor, infra",
        ge=1,
        le=10_000,
    )


class Health(BaseSettings):
    """The health check and its Slack alerts; a base of `agentq.config.Settings`."""

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


class Reconciler(BaseSettings):
    """The reconciler; a base of `agentq.config.Settings`."""

    reconcile_interval_s: Int = var(
        "RECONCILE_INTERVAL", 60,
        "Seconds between reconciler runs by the local Lambda host (0 = off).",
        "local host", ge=0, le=86_400,
    )  # fmt: skip
    reconcile_lost_after_s: Int = var(
        "RECONCILE_LOST_AFTER", 1800,
        "A PENDING/RETRYING task due, or a PROCESSING lease lapsed, longer than this (s) "
        "has lost its message and is sent again, unless a worker saw its message wait "
        "for its tenant's seat within it too. Keep it above the queue's visibility "
        "timeout and the retry backoff cap, or healthy backlogs get duplicate messages.",
        "reconciler", ge=1, le=604_800,
    )  # fmt: skip
    reconcile_page_size: Int = var(
        "RECONCILE_PAGE_SIZE", 250,
        "Items the reconciler reads per run from each status index partition it watches "
        "(4 per task state, 4 of RUNNING jobs), resuming where its last run stopped and "
        "starting over at the end: a run's cost is bounded by it, and a backlog of N per "
        "partition is passed in about N / this runs.",
        "reconciler", ge=1, le=10_000,
    )  # fmt: skip
    reconcile_stall_after_s: Int = var(
        "RECONCILE_STALL_AFTER", 300,
        "A running job whose last task change is older than this (s) and that the "
        "dispatcher should have moved on (uncounted terminal task, BLOCKED task with "
        "finished dependencies, every task counted) is moved on by the reconciler.",
        "reconciler", ge=1, le=604_800,
    )  # fmt: skip


class ProducerApi(BaseSettings):
    """The producer API's tenancy (docs/security.md); a base of `agentq.config.Settings`."""

    api_account_tenant: Flag = var(
        "API_ACCOUNT_TENANT", False,
        "Producer API: a caller whose IAM principal is mapped to no tenant acts for its "
        "AWS account id's tenant (single-tenant deployments); off: it is refused (403).",
        "producer-api",
    )  # fmt: skip
    api_tenant_cache_s: Int = var(
        "API_TENANT_CACHE_SECONDS", 30,
        "Seconds the producer API keeps a principal's tenant mapping (0 = read it on "
        "every request): a changed or removed mapping takes effect within this bound.",
        "producer-api", ge=0, le=300,
    )  # fmt: skip
    api_definition_admins_list: str | None = var(
        "API_DEFINITION_ADMINS", None,
        "Producer API: the IAM roles and users (ARNs, comma-separated) that may create, "
        "replace and delete task definitions; every other caller may only read them "
        "(403). Unset: no caller may change them through the API (the definitions "
        "loader's deploys still do).",
        "producer-api", min_length=1, max_length=20_000,
    )  # fmt: skip


class Runtime(BaseSettings):
    """The runtime: ECS, logging, the test clock; a base of `agentq.config.Settings`."""

    ecs_agent_uri: str | None = var(
        "ECS_AGENT_URI", None, "Set by ECS; enables task scale-in protection.", "worker", **URL
    )
    log_level: Annotated[LogLevel, Level] = var("LOG_LEVEL", "INFO", "Log level.", "all")
    metric_tenants_list: str | None = var(
        "METRIC_TENANTS", None,
        "Tenants whose worker metrics carry their own `tenant` dimension, as `a,b,...` "
        "(at most 50); every other tenant's are summed as `(other)`. Each named tenant "
        "adds about 7 billed CloudWatch metrics (docs/operations.md, \"Metrics\").",
        "worker", min_length=1, max_length=6_500,
        pattern=r"^[a-zA-Z0-9_.-]{1,128}(,[a-zA-Z0-9_.-]{1,128}){0,49}$",
    )  # fmt: skip
    clock_offset_ms: Int = var(
        "AGENTQ_TEST_CLOCK_OFFSET_MS", 0,
        "TEST ONLY: shifts this process's agentq clock (`agentq.events.now_ms`: leases, "
        "locks, retry times) by this many ms, to play a host with a skewed clock (the "
        "chaos harness's --faults mode). Never set it in a deployment.",
        "chaos harness", ge=-60_000, le=60_000,
    )  # fmt: skip
