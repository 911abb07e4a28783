"""Task queries through the byJob and byStatus indexes (eventually consistent: the
lock decisions never read them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.resources import STATUS_SHARDS
from agentq.states import TaskState
from agentq.store import keys
from agentq.store._dynamo import query_all
from agentq.store.codec import values
from agentq.store.records import TaskRecord


class TaskQueries:
    """The index-reading part of `TaskStore`."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def tasks_of_job(self, tenant: str, job_id: str) -> list[TaskRecord]:
        """All tasks of a job, through the byJob index (ordered by request id)."""
        items = query_all(
            self._ddb,
            TableName=self._table,
            IndexName="byJob",
            KeyConditionExpression="jobPK = :pk",
            ExpressionAttributeValues=values(pk=keys.job_pk(tenant, job_id)),
        )
        return [TaskRecord.from_item(item) for item in items]

    def tasks_by_status(
        self,
        state: TaskState,
        *,
        due_before_ms: int | None = None,
        limit: int | None = None,
    ) -> list[TaskRecord]:
        """Live tasks in `state`, ordered by due time, across every status shard.

        Due time: lease expiry for PROCESSING, creation for PENDING/BLOCKED, the retry
        time for RETRYING. Terminal tasks are not in the index.
        """
        merged: list[tuple[str, Mapping[str, Any]]] = []
        for shard in range(STATUS_SHARDS):
            condition = "statusPK = :pk"
            attrs = values(pk=keys.status_partition(state.value, shard))
            if due_before_ms is not None:
                condition += " AND statusSK < :bound"
                attrs.update(values(bound=keys.due_bound(due_before_ms)))
            query: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": "byStatus",
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": attrs,
            }
            items = query_all(self._ddb, limit=limit, **query)
            merged.extend((item["statusSK"]["S"], item) for item in items)
        merged.sort(key=lambda pair: pair[0])
        records = [TaskRecord.from_item(item) for _, item in merged]
        return records[:limit] if limit is not None else records
