"""The one definition of agentq's AWS resources, shared by `infra/` and the local stack.

Names, queue settings, key schema, indexes and event-routing rules live here so that
the CDK stacks and the moto-based local stack cannot drift apart (a test reads both).
Nothing here talks to AWS.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

APP_NAME_DEFAULT: Final = "agentq"


@dataclass(frozen=True, kw_only=True)
class QueueSpec:
    visibility_timeout_s: int = 900
    receive_wait_s: int = 20
    max_receive_count: int = 3
    retention_days: int = 4
    dlq_retention_days: int = 14


TASK_QUEUE: Final = QueueSpec()

# Priority tiers (docs/scheduling.md): each its own queue, all redriving into the one DLQ.
# The default tier's queue is the task queue itself, so single-queue setups are unchanged.
PRIORITY_TIERS: Final = ("high", "normal", "low")
DEFAULT_TIER: Final = "normal"


@dataclass(frozen=True, kw_only=True)
class IndexSpec:
    """A global secondary index: one named query pattern."""

    name: str
    partition_key: str
    sort_key: str
    purpose: str


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    partition_key: str
    sort_key: str | None
    indexes: tuple[IndexSpec, ...] = ()
    ttl_attribute: str | None = None

    @property
    def key_attributes(self) -> tuple[str, ...]:
        names = [self.partition_key]
        if self.sort_key:
            names.append(self.sort_key)
        for index in self.indexes:
            names.extend([index.partition_key, index.sort_key])
        return tuple(dict.fromkeys(names))


# Index names are part of the query patterns in agentq.store; keep them stable.
INDEX_BY_JOB: Final = IndexSpec(
    name="byJob",
    partition_key="jobPK",
    sort_key="jobSK",
    purpose="tasks of a job (STATE items carry jobPK = JOB#{tenant}#{jobId})",
)
INDEX_BY_STATUS: Final = IndexSpec(
    name="byStatus",
    partition_key="statusPK",
    sort_key="statusSK",
    purpose=(
        "live tasks by status ordered by due time; partition sharded "
        "(STATUS#{state}#{shard}) so one hot status cannot throttle; terminal tasks leave it"
    ),
)
INDEX_BY_TENANT: Final = IndexSpec(
    name="byTenant",
    partition_key="tenantPK",
    sort_key="tenantSK",
    purpose="a tenant's events by time (EVENTS#{tenant}) and jobs by time (JOBS#{tenant})",
)
INDEX_BY_TYPE: Final = IndexSpec(
    name="byType",
    partition_key="typePK",
    sort_key="typeSK",
    purpose="events by detail type by time (TYPE#{app}#{detailType})",
)

EVENTS_TABLE: Final = TableSpec(
    partition_key="PK",
    sort_key="SK",
    indexes=(INDEX_BY_JOB, INDEX_BY_STATUS, INDEX_BY_TENANT, INDEX_BY_TYPE),
    ttl_attribute="ttl",
)
DEFINITIONS_TABLE: Final = TableSpec(partition_key="name", sort_key=None)

STATUS_SHARDS: Final = 4


def status_shard(request_id: str) -> int:
    """Stable shard for a task in the status index (not Python's salted hash())."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=2).digest()
    return int.from_bytes(digest, "big") % STATUS_SHARDS


@dataclass(frozen=True, kw_only=True)
class ResourceNames:
    """Physical names for one stage. CDK lets CloudFormation name the bucket."""

    stage: str
    app_name: str = APP_NAME_DEFAULT

    @property
    def prefix(self) -> str:
        return f"{self.app_name}-{self.stage}"

    @property
    def task_queue(self) -> str:
        return f"{self.prefix}-tasks"

    def tier_queue(self, tier: str, *, default_tier: str = DEFAULT_TIER) -> str:
        """A priority tier's queue: the task queue for the default tier."""
        return self.task_queue if tier == default_tier else f"{self.task_queue}-{tier}"

    def tier_queues(
        self, tiers: tuple[str, ...] = PRIORITY_TIERS, *, default_tier: str = DEFAULT_TIER
    ) -> dict[str, str]:
        """Every tier's queue name, highest first."""
        return {tier: self.tier_queue(tier, default_tier=default_tier) for tier in tiers}

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.prefix}-tasks-dlq"

    @property
    def events_table(self) -> str:
        return f"{self.prefix}-events"

    @property
    def definitions_table(self) -> str:
        return f"{self.prefix}-task-definitions"

    @property
    def event_bus(self) -> str:
        return f"{self.prefix}-bus"

    @property
    def local_bucket(self) -> str:
        return f"{self.prefix}-artifacts"

    def rule_target_queue(self, rule: RuleSpec) -> str:
        """Locally, a Lambda-target rule delivers to a queue that the Lambda host polls."""
        return f"{self.prefix}-{rule.name}-target"


# Task Cancelled: a running job task cancelled by its worker; the dispatcher applies
# the job's failure policy (its own cancels re-trigger it harmlessly: nothing changes).
TERMINAL_TASK_EVENTS: Final = ("Task Completed", "Task Failed", "Task Timeout", "Task Cancelled")


@dataclass(frozen=True, kw_only=True)
class RuleSpec:
    """An EventBridge rule on the stage's bus; `target` names the consumer."""

    name: str
    target: str  # "save-event" | "dispatcher" | "task-queue"
    description: str
    detail_types: tuple[str, ...] = ()
    # Every detail type but these (EventBridge's anything-but); exclusive with detail_types.
    excluded_detail_types: tuple[str, ...] = ()
    extra_detail: dict[str, Any] = field(default_factory=dict)
    # An SQS target's MessageGroupId, as an EventBridge dynamic path into the event (the
    # whole value a JSON path): the tenant, so the task queue's fair queues see it.
    message_group_path: str | None = None

    def pattern(self, app_name: str) -> dict[str, Any]:
        pattern: dict[str, Any] = {"source": [app_name]}
        if self.detail_types:
            pattern["detail-type"] = list(self.detail_types)
        elif self.excluded_detail_types:
            pattern["detail-type"] = [{"anything-but": list(self.excluded_detail_types)}]
        if self.extra_detail:
            pattern["detail"] = dict(self.extra_detail)
        return pattern


# What save-event would only drop never reaches it: a heartbeat every 20 s per running
# task (the STATE item holds the last beat) and 'Task Requested' (its own rule queues
# it). Every other type, including ones added later, is stored.
SAVE_EVENT_SKIPPED_TYPES: Final = ("Task Heartbeat", "Task Requested")
SAVE_EVENT_RULE: Final = RuleSpec(
    name="save-event",
    target="save-event",
    description="agentq events into the events table, but heartbeats and requests",
    excluded_detail_types=SAVE_EVENT_SKIPPED_TYPES,
)
DISPATCHER_RULE: Final = RuleSpec(
    name="dispatcher",
    target="dispatcher",
    description="terminal task events of job tasks drive the job DAG",
    detail_types=TERMINAL_TASK_EVENTS,
    extra_detail={"jobId": [{"exists": True}]},
)
# 'Task Requested' events from any producer go straight onto the task queue, in two
# rules that match apart: one naming its tenant carries it as MessageGroupId (as every
# agentq send does, for SQS fair queues); one without (the worker's TENANT_ID runs it)
# has nothing a dynamic path could read, and goes without a group (a fair queue takes
# each such message for a tenant of its own).
TASK_REQUESTED_RULE: Final = RuleSpec(
    name="task-requested",
    target="task-queue",
    description="'Task Requested' events naming a tenant onto the task queue, grouped by it",
    detail_types=("Task Requested",),
    extra_detail={"tenant": [{"exists": True}]},
    message_group_path="$.detail.tenant",
)
TASK_REQUESTED_DEFAULT_TENANT_RULE: Final = RuleSpec(
    name="task-requested-default-tenant",
    target="task-queue",
    description="'Task Requested' events naming no tenant onto the task queue",
    detail_types=("Task Requested",),
    extra_detail={"tenant": [{"exists": False}]},
)
RULES: Final = (SAVE_EVENT_RULE, DISPATCHER_RULE, TASK_REQUESTED_RULE,
                TASK_REQUESTED_DEFAULT_TENANT_RULE)  # fmt: skip

# What a deployed secret holds until an operator sets it (docs/operations.md, "Secrets"):
# a value nobody could mistake for a key, which the worker refuses at start-up.
SECRET_PLACEHOLDER: Final = "agentq-placeholder-set-this-secret-before-starting-workers"

# Every object a task attempt writes lives under
# `{ARTIFACTS_PREFIX}{tenant}/{requestId}/attempt-{n}/` (agentq.store.keys.attempt_prefix):
# scoped by tenant so one tenant never reads another's, and by attempt so a stale holder
# writes only into its own attempt's folder. IAM grants and the lifecycle rule use the
# prefix as it is.
ARTIFACTS_PREFIX: Final = "task/"
EVENT_OVERFLOW_PREFIX: Final = "events/overflow/"
DLQ_ARCHIVE_PREFIX: Final = "dlq/archive/"

# Partition key prefixes of the events table's items producers write: a task's STATE
# and events, a job and its events (agentq.store.keys). A producer's PutItem and
# UpdateItem are scoped to them (infra), so it cannot write the items below.
TASK_PK_PREFIX: Final = "TASK#"
JOB_PK_PREFIX: Final = "JOB#"
# Partition key prefixes of the events table's operator-owned items: a tenant's limit
# override and seats (agentq.store.tenants), a principal's tenant mapping
# (agentq.principals). The operator's PutItem and DeleteItem are scoped to them (infra).
TENANT_PK_PREFIX: Final = "TENANT#"
PRINCIPAL_PK_PREFIX: Final = "PRINCIPAL#"
# The workers' roster (agentq.store.workers): `agentq stats` and the console read it.
ROSTER_PK: Final = "WORKERS"
