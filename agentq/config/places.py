"""Settings of where things are: the stack, its region and names, the queues, tables,
bus and bucket.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic_settings import BaseSettings

from agentq.config.fields import NAME, URL, Choice, Flag, var

TIER: Final = r"[a-z][a-z0-9-]{0,31}"
_URL_LIST_PATTERN: Final = rf"^{TIER}=\S+(,{TIER}=\S+)*$"


class Places(BaseSettings):
    """Where things are; a base of `agentq.config.Settings`."""

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
        pattern=rf"^{TIER}(,{TIER}){{0,9}}$",
    )  # fmt: skip
    default_priority: str = var(
        "DEFAULT_PRIORITY", "normal",
        "Tier of a task whose producer, job and definition name none; its queue is "
        "SQS_QUEUE_URL unless SQS_QUEUE_URLS names it.",
        "worker, client, dispatcher, API", min_length=1, max_length=32, pattern=rf"^{TIER}$",
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
        "Directories of task definition files (*.yaml, *.json), separated like PATH; "
        "a worker reads them again when they change (no restart).",
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
