"""Settings of the worker: receiving, leases and scheduling; the task child and Claude."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic_settings import BaseSettings

from agentq.config.fields import DAY_MS, NAME, Choice, Flag, Float, Int, var
from agentq.config.light import DEFAULT_MODEL
from agentq.config.places import TIER

# Mid-priced and current: Opus costs 5/3 as much per token, and is one setting away.

# When a worker's warm spares import the Claude SDK (see worker/child/spares.py).
WarmAgent = Literal["recent", "always", "never"]
# How the worker's receiver picks a priority tier (worker/scheduler.py).
SchedulerMode = Literal["strict", "weighted", "round-robin"]
_WEIGHT_LIST_PATTERN: Final = rf"^{TIER}=[0-9.]+(,{TIER}=[0-9.]+)*$"


class Receiving(BaseSettings):
    """Receiving, leases, scheduling and retries; a base of `agentq.config.Settings`."""

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
        "within this time, at the rate its slots have lately been freeing (0: only free "
        "slots).",
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
        "(GetQueueAttributes), only those no receive told about within it; between "
        "refreshes receives estimate it (0: never ask).",
        "worker", ge=0, le=DAY_MS,
    )  # fmt: skip
    probe_interval_ms: Int = var(
        "SCHEDULER_PROBE_INTERVAL", 1_000,
        "The lowest tier, found empty, is checked again (a short poll) after this long "
        "(ms), doubling per empty check up to 8x; the tiers above it have long polls of "
        "their own.",
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
        "How long (ms) a delete, visibility change or requeued copy may wait for "
        "companions before its batch call (sent at once when 10 are ready, or when a "
        "message is passed on to the fleet).",
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
        "due; a longer wait is several re-delays. Each also ends at most 12 hours (less "
        "5 minutes) after its receive, as SQS allows.",
        "worker", ge=1, le=43_200,
    )  # fmt: skip
    tenant_concurrency_limit: Int = var(
        "TENANT_CONCURRENCY_LIMIT", 0,
        "Tasks of one tenant that may hold a lock at once across the whole fleet (0: "
        "unlimited); `agentq tenants limit` overrides it per tenant.",
        "worker", ge=0, le=1_000,  # agentq.store.tenants.MAX_LIMIT
    )  # fmt: skip
    tenant_limit_backoff_ms: Int = var(
        "TENANT_LIMIT_BACKOFF", 2_000,
        "How long (ms, jittered from half to the whole) a task over its tenant's limit "
        "waits before it is tried again; no attempt and no receive is spent.",
        "worker", ge=100, le=900_000,
    )  # fmt: skip
    tenant_limit_park_ms: Int = var(
        "TENANT_LIMIT_PARK", 10_000,
        "How long (ms) a worker keeps a task refused for its tenant's limit, waiting for "
        "a seat (tried again when one frees here, else after the back-off), before it "
        "goes back to its queue; 0: at once.",
        "worker", ge=0, le=600_000,
    )  # fmt: skip
    drain_timeout_ms: Int = var(
        "DRAIN_TIMEOUT",
        120_000,
        "On SIGTERM, how long (ms) running tasks may finish before they are stopped.",
        "worker",
        ge=0,
        le=DAY_MS,
    )
    protection_max_ms: Int = var(
        "PROTECTION_MAX_AGE", 3_600_000,
        "With ECS_AGENT_URI: how long (ms) scale-in protection may stay on without a "
        "break before the worker retires (starts nothing new, lets its running tasks "
        "finish, exits), so a deploy or scale-in waits at most this plus the longest task.",
        "worker", ge=1_000, le=DAY_MS,
    )  # fmt: skip
    worker_id: str | None = var(
        "WORKER_ID", None, "Worker identity in leases and events (default host:pid).", "worker",
        **NAME,
    )  # fmt: skip


class Child(BaseSettings):
    """The task child and Claude; a base of `agentq.config.Settings`."""

    task_timeout_ms: Int = var(
        "CLAUDE_TIMEOUT",
        200_000,
        "Child process timeout (ms) when the definition sets none; at most 11 hours, "
        "as a definition's (SQS hides a running task's message 12 hours at most).",
        "worker",
        ge=100,
        le=39_600_000,  # agentq.definitions.MAX_TIMEOUT_S
    )
    kill_grace_ms: Int = var(
        "CLAUDE_KILL_GRACE", 5_000, "SIGTERM → SIGKILL grace (ms).", "worker", ge=0, le=600_000
    )
    checkpoint_interval_ms: Int = var(
        "AGENT_CHECKPOINT_INTERVAL",
        5_000,
        "Least time (ms) between two uploads of a resumable agent task's session "
        "checkpoint to S3; a checkpoint is uploaded only when the transcript changed.",
        "worker",
        ge=50,
        le=3_600_000,
    )
    warm_children: Flag = var(
        "WARM_CHILDREN",
        True,
        "Keep pre-started child processes ready for the next tasks.",
        "worker",
    )
    fork_spares: Flag = var(
        "FORK_SPARES",
        True,
        "Fork plain warm children from one warmed process per worker (~2 ms each) "
        "instead of starting each afresh (~0.1 s of CPU).",
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
        "CLAUDE_MODEL",
        DEFAULT_MODEL,
        "Default model of agent tasks; a definition's `settings.model` overrides it "
        "(`claude-opus-4-5` for the most capable, at 5/3 the price: docs/cost.md).",
        "child",
        **NAME,
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
