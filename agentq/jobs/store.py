"""The job item: spec, failure policy, state and progress counters.

PK=JOB#{tenant}#{jobId}, SK=JOB; listed per tenant through the byTenant index
(tenantPK=JOBS#{tenant}, tenantSK={iso created}#{jobId}).

Counting is the heart of closing a job exactly once: each terminal task is counted by
one conditional update that also adds its key to `countedTasks` (a duplicate event
counts nothing), returning the new counters; closing is a second conditional update
(`RUNNING` and every task counted), so exactly one caller closes the job.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from botocore.exceptions import ClientError

from agentq.errors import InvalidInput, NotFound
from agentq.events import iso_ms, now_ms
from agentq.jobs.spec import JobSpec, parse_spec
from agentq.states import TaskState
from agentq.store import keys
from agentq.store._dynamo import condition_failed, query_all
from agentq.store.codec import from_item, serialize, to_item, values

JobState = Literal["RUNNING", "COMPLETED", "FAILED"]

# Which counter a terminal task state adds to.
COUNTER_OF: Final[Mapping[TaskState, str]] = {
    TaskState.COMPLETED: "completed",
    TaskState.FAILED: "failed",
    TaskState.TIMEOUT: "timedOut",
    TaskState.CANCELLED: "cancelled",
}
COUNTERS: Final = ("completed", "failed", "timedOut", "cancelled", "done")


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    job_id: str
    tenant: str
    state: JobState
    spec: JobSpec
    total: int
    counts: Mapping[str, int]
    counted: frozenset[str]
    cost_usd: float
    created_at_ms: int
    closed_at_ms: int | None
    closed_by: str | None
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def done(self) -> int:
        return self.counts.get("done", 0)

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "tenant": self.tenant,
            "name": self.spec.name,
            "state": self.state,
            "failurePolicy": self.spec.failure_policy,
            "total": self.total,
            **{name: self.counts.get(name, 0) for name in COUNTERS},
            "costUsd": self.cost_usd,
            "createdAt": iso_ms(self.created_at_ms),
            "closedAt": iso_ms(self.closed_at_ms) if self.closed_at_ms else None,
        }

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> JobRecord:
        data = from_item(item)
        return cls(
            job_id=data["jobId"],
            tenant=data["tenant"],
            state=data["state"],
            spec=parse_spec(data["spec"]),
            total=int(data["total"]),
            counts={name: int(data.get(name, 0)) for name in COUNTERS},
            counted=frozenset(data.get("countedTasks") or ()),
            cost_usd=float(data.get("costUsd", 0)),
            created_at_ms=int(data["createdAt"]),
            closed_at_ms=data.get("closedAt"),
            closed_by=data.get("closedBy"),
            raw=data,
        )


class JobStore:
    """Job items of the events table. The DynamoDB client is passed in."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def create(self, tenant: str, job_id: str, spec: JobSpec) -> tuple[JobRecord, bool]:
        """Write the job item once; returns the record and whether this call wrote it."""
        now = now_ms()
        item = {
            "PK": keys.job_pk(tenant, job_id),
            "SK": keys.JOB_SK,
            "jobId": job_id,
            "tenant": tenant,
            "state": "RUNNING",
            "spec": spec.to_dict(),
            "name": spec.name,
            "failurePolicy": spec.failure_policy,
            "total": len(spec.tasks),
            **{name: 0 for name in COUNTERS},
            "costUsd": 0,
            "createdAt": now,
            "updatedAt": now,
            "tenantPK": keys.tenant_jobs_pk(tenant),
            "tenantSK": f"{iso_ms(now)}#{job_id}",
            # In the status index while RUNNING, so the reconciler finds open jobs
            # without a scan; `close` removes it.
            "statusPK": keys.running_job_pk(job_id),
            "statusSK": keys.status_sk(now, tenant, job_id),
        }
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item=to_item(item),
                ConditionExpression="attribute_not_exists(PK)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if not condition_failed(error):
                raise
            old: Mapping[str, Any] | None = error.response.get("Item")  # type: ignore[assignment]
            return (JobRecord.from_item(old) if old else self.require(tenant, job_id)), False
        return JobRecord.from_item(to_item(item)), True

    def get(self, tenant: str, job_id: str) -> JobRecord | None:
        item = self._ddb.get_item(
            TableName=self._table, Key=self._key(tenant, job_id), ConsistentRead=True
        ).get("Item")
        return JobRecord.from_item(item) if item else None

    def require(self, tenant: str, job_id: str) -> JobRecord:
        record = self.get(tenant, job_id)
        if record is None:
            raise NotFound("job", job_id)
        return record

    def list(self, tenant: str, *, limit: int = 50) -> list[JobRecord]:
        """A tenant's jobs, newest first."""
        items = query_all(
            self._ddb,
            limit=limit,
            TableName=self._table,
            IndexName="byTenant",
            KeyConditionExpression="tenantPK = :pk",
            ExpressionAttributeValues=values(pk=keys.tenant_jobs_pk(tenant)),
            ScanIndexForward=False,
        )
        return [JobRecord.from_item(item) for item in items]

    def page(
        self,
        tenant: str,
        *,
        limit: int = 50,
        start: Mapping[str, Any] | None = None,
        state: JobState | None = None,
        max_queries: int = 20,
        since_ms: int | None = None,
        until_ms: int | None = None,
        id_contains: str | None = None,
        definition: str | None = None,
    ) -> tuple[builtins.list[JobRecord], dict[str, Any] | None]:
        """One page of a tenant's jobs, newest first, optionally in one state.

        Returns the records and the key to pass as `start` for the next page (None at
        the end). A state filter is applied by DynamoDB after reading, so pages are
        followed until `limit` matches are found, the partition ends, or `max_queries`
        queries were spent (a rare state in a long history returns a short page and a
        key to go on from, instead of reading the whole partition in one call). The
        same holds for a creation-time range (a key condition), part of the job id and
        a definition any of its tasks runs.
        """
        query: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": "byTenant",
            "KeyConditionExpression": "tenantPK = :pk",
            "ExpressionAttributeValues": values(pk=keys.tenant_jobs_pk(tenant)),
            "ScanIndexForward": False,
        }
        if since_ms is not None or until_ms is not None:
            # tenantSK is the creation time first: a time range is a key condition.
            query["KeyConditionExpression"] += " AND tenantSK BETWEEN :lo AND :hi"
            query["ExpressionAttributeValues"].update(values(
                lo=iso_ms(since_ms or 0),
                hi=iso_ms(until_ms) + "~" if until_ms is not None else "~",
            ))  # fmt: skip
        filters, names = [], {}
        if state is not None:
            filters.append("#state = :state")
            names["#state"] = "state"
            query["ExpressionAttributeValues"].update(values(state=state))
        if id_contains:
            filters.append("contains(jobId, :text)")
            query["ExpressionAttributeValues"].update(values(text=id_contains))
        if filters:
            query["FilterExpression"] = " AND ".join(filters)
        if names:
            query["ExpressionAttributeNames"] = names
        if start:
            query["ExclusiveStartKey"] = dict(start)
        found: builtins.list[JobRecord] = []
        for _ in range(max(1, max_queries)):
            response = self._ddb.query(Limit=limit - len(found), **query)
            records = (JobRecord.from_item(item) for item in response.get("Items", []))
            # A definition is one of the spec's tasks: matched here, not by DynamoDB.
            found.extend(r for r in records if definition is None
                         or any(t.definition == definition for t in r.spec.tasks))  # fmt: skip
            last = response.get("LastEvaluatedKey")
            if not last or len(found) >= limit:
                return found, last or None
            query["ExclusiveStartKey"] = last
        return found, last

    def count(
        self, tenant: str, job_id: str, task_key: str, state: TaskState, *, cost_usd: float = 0
    ) -> JobRecord | None:
        """Count one terminal task; None when it was already counted."""
        counter = COUNTER_OF[state]
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key=self._key(tenant, job_id),
                UpdateExpression=(
                    "ADD #counter :one, #done :one, countedTasks :keys, costUsd :cost "
                    "SET updatedAt = :now"
                ),
                ConditionExpression=(
                    "attribute_exists(PK) AND "
                    "(attribute_not_exists(countedTasks) OR NOT contains(countedTasks, :key))"
                ),
                ExpressionAttributeNames={"#counter": counter, "#done": "done"},
                ExpressionAttributeValues={
                    **values(one=1, key=task_key, cost=float(cost_usd), now=now_ms()),
                    ":keys": {"SS": [task_key]},
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as error:
            if condition_failed(error):
                return None
            raise
        return JobRecord.from_item(response["Attributes"])

    def uncount(
        self, tenant: str, job_id: str, task_key: str, state: TaskState
    ) -> JobRecord | None:
        """Undo `count` of a task that is retried: its counter and `done` go down, the
        key leaves `countedTasks`, and a closed job is RUNNING again (back in the status
        index, its close to be published anew). None when the key was not counted (a
        retried call that was applied already, or a task not counted yet)."""
        now = now_ms()
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key=self._key(tenant, job_id),
                UpdateExpression=(
                    "ADD #counter :minus, #done :minus DELETE countedTasks :keys "
                    "SET #state = :running, updatedAt = :now, statusPK = :spk, statusSK = :ssk "
                    "REMOVE closedAt, closedBy, closePublished"
                ),
                ConditionExpression="attribute_exists(PK) AND contains(countedTasks, :key)",
                ExpressionAttributeNames={"#counter": COUNTER_OF[state], "#done": "done",
                                          "#state": "state"},
                ExpressionAttributeValues={
                    **values(minus=-1, key=task_key, now=now, running="RUNNING",
                             spk=keys.running_job_pk(job_id),
                             ssk=keys.status_sk(now, tenant, job_id)),
                    ":keys": {"SS": [task_key]},
                },
                ReturnValues="ALL_NEW",
            )  # fmt: skip
        except ClientError as error:
            if condition_failed(error):
                return None
            raise
        return JobRecord.from_item(response["Attributes"])

    def close(
        self, tenant: str, job_id: str, state: JobState, *, closed_by: str
    ) -> JobRecord | None:
        """RUNNING → COMPLETED/FAILED once every task is counted; None if not this call."""
        now = now_ms()
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key=self._key(tenant, job_id),
                UpdateExpression=(
                    "SET #state = :state, closedAt = :now, closedBy = :by, updatedAt = :now "
                    "REMOVE statusPK, statusSK"
                ),
                ConditionExpression="#state = :running AND #done >= #total",
                ExpressionAttributeNames={"#state": "state", "#done": "done", "#total": "total"},
                ExpressionAttributeValues=values(
                    state=state, now=now, by=closed_by, running="RUNNING"
                ),
                ReturnValues="ALL_NEW",
            )
        except ClientError as error:
            if condition_failed(error):
                return None
            raise
        return JobRecord.from_item(response["Attributes"])

    def mark_close_published(self, tenant: str, job_id: str) -> None:
        """After the Job Completed/Failed event went out: a retry need not send it again."""
        self._ddb.update_item(
            TableName=self._table,
            Key=self._key(tenant, job_id),
            UpdateExpression="SET closePublished = :yes",
            ExpressionAttributeValues=values(yes=True),
        )

    def add_tasks(self, job: JobRecord, spec: JobSpec) -> JobRecord:
        """Store an extended spec (old tasks plus new ones) on a RUNNING job."""
        added = len(spec.tasks) - len(job.spec.tasks)
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key=self._key(job.tenant, job.job_id),
                UpdateExpression="SET spec = :spec, updatedAt = :now ADD #total :added",
                # The spec we extended must still be the stored one (no lost update).
                ConditionExpression="#state = :running AND #total = :old",
                ExpressionAttributeNames={"#state": "state", "#total": "total"},
                ExpressionAttributeValues={
                    ":spec": serialize(spec.to_dict()),
                    **values(now=now_ms(), added=added, running="RUNNING", old=job.total),
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as error:
            if condition_failed(error):
                raise InvalidInput(
                    "jobId", f"job {job.job_id} is closed or changed concurrently; retry"
                ) from None
            raise
        return JobRecord.from_item(response["Attributes"])

    @staticmethod
    def _key(tenant: str, job_id: str) -> dict[str, Any]:
        return {"PK": {"S": keys.job_pk(tenant, job_id)}, "SK": {"S": keys.JOB_SK}}
