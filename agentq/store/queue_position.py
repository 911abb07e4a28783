"""How many PENDING tasks are ahead of one PENDING task, as the scheduler sees the queue.

The status index orders PENDING tasks by when they were queued (`statusSK` = due time,
tenant, request id), so the tasks ahead of one are those of its tier with a smaller
sort key: one Query per status shard, two attributes each, at most `MAX_COUNTED`
entries per shard (beyond: "more than N", `QueuePosition.capped`). Reads only; a
failed read leaves the caller's reason without a count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentq.resources import STATUS_SHARDS
from agentq.states import TaskState
from agentq.store import keys
from agentq.store.codec import values
from agentq.store.records import TaskRecord

MAX_COUNTED: Final = 1000  # index entries read per shard at most


@dataclass(frozen=True, kw_only=True)
class QueuePosition:
    tier: str
    ahead: int  # PENDING tasks of the same tier queued before this one
    ahead_same_tenant: int  # of those, the task's own tenant's
    capped: bool  # the bound was reached: `ahead` is a lower bound


def tier_of(record_or_envelope: Mapping[str, Any] | None, default_tier: str) -> str:
    priority = (record_or_envelope or {}).get("priority")
    return priority if isinstance(priority, str) and priority else default_tier


def queue_position(
    dynamodb: Any, table: str, record: TaskRecord, *, default_tier: str
) -> QueuePosition | None:
    """Where a PENDING task stands in its tier (None for a task not PENDING or not in
    the status index)."""
    sort_key = record.raw.get("statusSK")
    if record.state is not TaskState.PENDING or not isinstance(sort_key, str):
        return None
    tier = tier_of(record.envelope, default_tier)
    ahead = same_tenant = 0
    capped = False
    for shard in range(STATUS_SHARDS):
        query: dict[str, Any] = {
            "TableName": table,
            "IndexName": "byStatus",
            "KeyConditionExpression": "statusPK = :pk AND statusSK < :mine",
            "ExpressionAttributeValues": values(
                pk=keys.status_partition(TaskState.PENDING.value, shard), mine=sort_key
            ),
            "ProjectionExpression": "#tenant, #envelope.#priority",
            "ExpressionAttributeNames": {
                "#tenant": "tenant", "#envelope": "envelope", "#priority": "priority"
            },
        }  # fmt: skip
        read = 0
        while True:
            response = dynamodb.query(Limit=MAX_COUNTED - read, **query)
            for item in response.get("Items", []):
                envelope = item.get("envelope", {}).get("M", {})
                priority = envelope.get("priority", {}).get("S")
                if (priority or default_tier) != tier:
                    continue
                ahead += 1
                if item.get("tenant", {}).get("S") == record.tenant:
                    same_tenant += 1
            read += int(response.get("Count", 0))
            last = response.get("LastEvaluatedKey")
            if not last:
                break
            if read >= MAX_COUNTED:
                capped = True
                break
            query["ExclusiveStartKey"] = last
    return QueuePosition(tier=tier, ahead=ahead, ahead_same_tenant=same_tenant, capped=capped)
