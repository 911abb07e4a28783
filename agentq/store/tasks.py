"""The task STATE item: creation, the conditional lock and finalization (lease renewal:
agentq.store.leases).

Every decision is one conditional UpdateItem on the STATE item (strongly consistent,
never a GSI read). A refused condition returns the item as it is, and the refusal is
turned into the exception that tells the caller what to do (see agentq.errors).

Each write marks the item (its lease token or a fresh write id) and goes through
agentq.store.idempotent: a retry that meets its own applied write reports success, and
a transaction conflict (the heartbeat's renewal transaction) is retried, not surfaced.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentq.envelope import TaskEnvelope
from agentq.errors import (
    AttemptsExhausted,
    CancelPending,
    LeaseLost,
    LockNotAcquired,
    NotFound,
    TaskAlreadyTerminal,
    TaskHeldElsewhere,
    TaskNotReady,
)
from agentq.events import now_ms
from agentq.resources import STATUS_SHARDS
from agentq.states import TERMINAL_STATES, TaskState
from agentq.store import idempotent, keys
from agentq.store._dynamo import query_all
from agentq.store.codec import from_item, serialize, to_item, values
from agentq.store.leases import Lease, LeaseRenewals, Renewals

__all__ = ["Lease", "Renewals", "TaskRecord", "TaskStore"]

logger = logging.getLogger(__name__)
_TERMINAL_VALUES: Final = tuple(sorted(s.value for s in TERMINAL_STATES))


@dataclass(frozen=True, kw_only=True)
class TaskRecord:
    """A task's STATE item, as read."""

    request_id: str
    tenant: str
    state: TaskState
    attempt: int
    definition: str | None
    job_id: str | None
    owner: str | None
    lease_token: str | None
    effective_until_ms: int | None
    created_at_ms: int | None
    updated_at_ms: int | None
    raw: Mapping[str, Any]

    @property
    def envelope(self) -> Mapping[str, Any] | None:
        value = self.raw.get("envelope")
        return value if isinstance(value, Mapping) else None

    def lease_live(self, at_ms: int | None = None) -> bool:
        if self.state is not TaskState.PROCESSING or self.effective_until_ms is None:
            return False
        return self.effective_until_ms >= (now_ms() if at_ms is None else at_ms)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> TaskRecord:
        data = from_item(item)
        return cls(
            request_id=data["requestId"],
            tenant=data["tenant"],
            state=TaskState(data["state"]),
            attempt=int(data.get("attempt", 0)),
            definition=data.get("definition"),
            job_id=data.get("jobId"),
            owner=data.get("owner"),
            lease_token=data.get("leaseToken"),
            effective_until_ms=data.get("effectiveUntil"),
            created_at_ms=data.get("createdAt"),
            updated_at_ms=data.get("updatedAt"),
            raw=data,
        )


class TaskStore(LeaseRenewals):
    """STATE items of the events table. The DynamoDB client is passed in."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    # -- reading -------------------------------------------------------------------
    def get(self, tenant: str, request_id: str) -> TaskRecord | None:
        response = self._ddb.get_item(
            TableName=self._table,
            Key=self._key(tenant, request_id),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return TaskRecord.from_item(item) if item else None

    def require(self, tenant: str, request_id: str) -> TaskRecord:
        record = self.get(tenant, request_id)
        if record is None:
            raise NotFound("task", request_id)
        return record

    # -- creating ------------------------------------------------------------------
    def create(
        self,
        envelope: TaskEnvelope,
        *,
        state: TaskState = TaskState.PENDING,
        idempotency_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Write a new STATE item; a second create of the same task changes nothing.

        Returns the record and whether this call created it.
        """
        if state not in (TaskState.PENDING, TaskState.BLOCKED, TaskState.SCHEDULED):
            raise ValueError(f"a task is created PENDING, BLOCKED or SCHEDULED, not {state}")
        now = now_ms()
        # A SCHEDULED task is due at its notBefore: the status index says so, so neither
        # the health check nor the reconciler counts it as waiting until then.
        due = envelope.not_before_ms if state is TaskState.SCHEDULED else None
        write_id = uuid.uuid4().hex
        item: dict[str, Any] = {
            "PK": keys.task_pk(envelope.tenant, envelope.request_id),
            "SK": keys.STATE_SK,
            "requestId": envelope.request_id,
            "tenant": envelope.tenant,
            "definition": envelope.definition,
            "state": state.value,
            "attempt": 0,
            "createdAt": now,
            "updatedAt": now,
            "envelope": envelope.to_dict(),
            "statusPK": keys.status_pk(state.value, envelope.request_id),
            "statusSK": keys.status_sk(due or now, envelope.tenant, envelope.request_id),
            "idempotencyKey": idempotency_key,
            **({"notBefore": due} if due is not None else {}),
            **self._job_keys(envelope),
            **(extra or {}),
            idempotent.WRITE_ID: write_id,
        }
        written = idempotent.put(
            self._ddb,
            mark=(idempotent.WRITE_ID, write_id),
            TableName=self._table,
            Item=to_item(item),
            ConditionExpression="attribute_not_exists(PK)",
        )
        if written.written:
            return TaskRecord.from_item(written.item or to_item(item)), True
        existing = written.item
        record = (
            TaskRecord.from_item(existing)
            if existing
            else self.require(envelope.tenant, envelope.request_id)
        )
        return record, False

    # -- the lock ------------------------------------------------------------------
    def acquire(
        self,
        envelope: TaskEnvelope,
        *,
        worker_id: str,
        lease_seconds: float,
        max_attempts: int,
        timeout_ms: int | None = None,
    ) -> Lease:
        """Take the task's lock for one attempt.

        Allowed when the task is new, PENDING or RETRYING, or PROCESSING with an expired
        lease, and attempts remain. Raises a `LockNotAcquired` subclass otherwise.
        """
        now = now_ms()
        if envelope.not_before_ms is not None and envelope.not_before_ms > now:
            # Early: never an attempt. The worker records it SCHEDULED if it is not yet
            # (agentq.store.scheduling.not_yet_due) and re-delays the message.
            raise TaskNotReady(envelope.request_id, TaskState.SCHEDULED.value,
                               envelope.not_before_ms)  # fmt: skip
        token = uuid.uuid4().hex
        effective_until = now + int(lease_seconds * 1000)
        names = {"#state": "state", "#owner": "owner", "#tenant": "tenant",
                 "#definition": "definition", "#attempt": "attempt"}  # fmt: skip
        attrs = values(
            processing=TaskState.PROCESSING.value,
            pending=TaskState.PENDING.value,
            retrying=TaskState.RETRYING.value,
            scheduled=TaskState.SCHEDULED.value,
            token=token,
            worker=worker_id,
            eu=effective_until,
            zero=0,
            one=1,
            now=now,
            max=max_attempts,
            deadline=now + timeout_ms if timeout_ms else None,
            spk=keys.status_pk(TaskState.PROCESSING.value, envelope.request_id),
            ssk=keys.status_sk(effective_until, envelope.tenant, envelope.request_id),
            rid=envelope.request_id,
            tenant=envelope.tenant,
            definition=envelope.definition,
            envelope=envelope.to_dict(),
        )
        sets = [
            "#state = :processing",
            "leaseToken = :token",
            "#owner = :worker",
            "effectiveUntil = :eu",
            "#attempt = if_not_exists(#attempt, :zero) + :one",
            "startedAt = :now",
            "updatedAt = :now",
            "lastHeartbeatAt = :now",
            "statusPK = :spk",
            "statusSK = :ssk",
            "requestId = if_not_exists(requestId, :rid)",
            "#tenant = if_not_exists(#tenant, :tenant)",
            "#definition = if_not_exists(#definition, :definition)",
            "envelope = if_not_exists(envelope, :envelope)",
            "createdAt = if_not_exists(createdAt, :now)",
            # The budget, for the DLQ processor: a dead letter with attempts left is
            # sent back rather than failed (agentq/dlq_return.py).
            "maxAttempts = :max",
        ]
        if timeout_ms:
            sets.append("deadlineAt = :deadline")
        else:
            del attrs[":deadline"]
        for name, value in self._job_keys(envelope).items():
            attrs[f":{name}"] = serialize(value)
            sets.append(f"{name} = if_not_exists({name}, :{name})")
        written = idempotent.update(
            self._ddb,
            mark=("leaseToken", token),
            TableName=self._table,
            Key=self._key(envelope.tenant, envelope.request_id),
            UpdateExpression="SET " + ", ".join(sets),
            ConditionExpression=(
                "(attribute_not_exists(PK) OR #state IN (:pending, :retrying) "
                "OR (#state = :scheduled AND notBefore <= :now) "
                "OR (#state = :processing AND effectiveUntil < :now "
                "AND attribute_not_exists(cancelRequested))) "
                "AND (attribute_not_exists(#attempt) OR #attempt < :max)"
            ),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=attrs,
            ReturnValues="ALL_NEW",
        )
        if not written.written or written.item is None:
            raise self._refusal(envelope, written.item, now, max_attempts)
        record = TaskRecord.from_item(written.item)
        return Lease(
            request_id=envelope.request_id,
            tenant=envelope.tenant,
            token=token,
            worker_id=worker_id,
            attempt=record.attempt,
            effective_until_ms=effective_until,
        )

    def _refusal(
        self,
        envelope: TaskEnvelope,
        item: Mapping[str, Any] | None,
        now: int,
        max_attempts: int,
    ) -> LockNotAcquired:
        if not item:
            # The item vanished between condition and read: treat as contention.
            return LockNotAcquired(envelope.request_id, None, "lock refused, task missing")
        record = TaskRecord.from_item(item)
        if record.state.terminal:
            return TaskAlreadyTerminal(envelope.request_id, record.state.value)
        if record.state is TaskState.BLOCKED:
            return TaskNotReady(envelope.request_id, record.state.value)
        if record.state is TaskState.SCHEDULED:
            return TaskNotReady(
                envelope.request_id, record.state.value, int(record.raw.get("notBefore") or now)
            )
        if record.raw.get("cancelRequested") and not record.lease_live(now):
            # Its worker died after a cancel was requested: the cancel ends it, not a rerun.
            return CancelPending(envelope.request_id, record.state.value)
        if record.lease_live(now):
            return TaskHeldElsewhere(
                envelope.request_id, record.owner, int(record.effective_until_ms or 0)
            )
        if record.attempt >= max_attempts:
            return AttemptsExhausted(envelope.request_id, record.attempt)
        return LockNotAcquired(
            envelope.request_id, record.state.value, "lock refused: task changed concurrently"
        )

    def finalize(
        self,
        lease: Lease,
        state: TaskState,
        *,
        retry_at_ms: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        """End an attempt: a terminal state, or RETRYING (message kept for redelivery).

        Conditional on the lease token, so a stale worker cannot overwrite a newer
        attempt; raises `LeaseLost` then.
        """
        if state is not TaskState.RETRYING and not state.terminal:
            raise ValueError(f"finalize to a terminal state or RETRYING, not {state}")
        now = now_ms()
        names = {"#state": "state"}
        attrs = values(state=state.value, now=now, token=lease.token,
                       processing=TaskState.PROCESSING.value)  # fmt: skip
        # finalizedBy marks the write as this attempt's: a retry of an applied finalize
        # finds it (leaseToken is gone by then) and reports success, not LeaseLost.
        sets = ["#state = :state", "updatedAt = :now", "finalizedBy = :token"]
        removes = ["effectiveUntil", "leaseToken"]
        if state is TaskState.RETRYING:
            due = retry_at_ms or now
            sets += ["statusPK = :spk", "statusSK = :ssk", "retryAt = :due"]
            attrs.update(
                values(
                    spk=keys.status_pk(state.value, lease.request_id),
                    ssk=keys.status_sk(due, lease.tenant, lease.request_id),
                    due=due,
                )
            )
        else:
            sets.append("finishedAt = :now")
            removes += ["statusPK", "statusSK"]
        for index, (name, value) in enumerate((fields or {}).items()):
            names[f"#f{index}"] = name
            attrs[f":f{index}"] = serialize(value)
            sets.append(f"#f{index} = :f{index}")
        written = idempotent.update(
            self._ddb,
            mark=("finalizedBy", lease.token),
            TableName=self._table,
            Key=self._key(lease.tenant, lease.request_id),
            UpdateExpression=f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
            ConditionExpression="leaseToken = :token AND #state = :processing",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=attrs,
            ReturnValues="ALL_NEW",
        )
        if not written.written or written.item is None:
            raise LeaseLost(lease.request_id, lease.token)
        return TaskRecord.from_item(written.item)

    # -- lease-free transitions -------------------------------------------------------
    def transition(
        self,
        tenant: str,
        request_id: str,
        *,
        from_states: Iterable[TaskState],
        to_state: TaskState,
        fields: Mapping[str, Any] | None = None,
        unless_lease_live: bool = False,
        due_ms: int | None = None,
    ) -> TaskRecord | None:
        """Move a task from one of `from_states` to `to_state`, atomically.

        Returns the new record, or None when the task was not in an allowed state (the
        caller lost a race or the event was a duplicate). With `unless_lease_live`, a
        PROCESSING task whose lease is live is left alone. `due_ms` is the status index's
        due time for a live `to_state` (default now; a SCHEDULED task's notBefore).
        """
        now = now_ms()
        write_id = uuid.uuid4().hex
        sources = sorted({s.value for s in from_states})
        names = {"#state": "state", "#wid": idempotent.WRITE_ID}
        attrs = values(to=to_state.value, now=now, wid=write_id)
        placeholders = []
        for index, source in enumerate(sources):
            attrs[f":s{index}"] = serialize(source)
            placeholders.append(f":s{index}")
        condition = f"#state IN ({', '.join(placeholders)})"
        if unless_lease_live:
            condition += " AND NOT (#state = :processing AND effectiveUntil >= :now)"
            attrs.update(values(processing=TaskState.PROCESSING.value))
        sets = ["#state = :to", "updatedAt = :now", "#wid = :wid"]
        removes: list[str] = []
        if to_state.terminal:
            sets.append("finishedAt = :now")
            removes += ["statusPK", "statusSK", "effectiveUntil", "leaseToken"]
        else:
            sets += ["statusPK = :spk", "statusSK = :ssk"]
            attrs.update(
                values(
                    spk=keys.status_pk(to_state.value, request_id),
                    ssk=keys.status_sk(due_ms or now, tenant, request_id),
                )
            )
        for index, (name, value) in enumerate((fields or {}).items()):
            names[f"#f{index}"] = name
            attrs[f":f{index}"] = serialize(value)
            sets.append(f"#f{index} = :f{index}")
        expression = "SET " + ", ".join(sets)
        if removes:
            expression += " REMOVE " + ", ".join(removes)
        written = idempotent.update(
            self._ddb,
            mark=(idempotent.WRITE_ID, write_id),
            TableName=self._table,
            Key=self._key(tenant, request_id),
            UpdateExpression=expression,
            ConditionExpression=f"attribute_exists(PK) AND {condition}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=attrs,
            ReturnValues="ALL_NEW",
        )
        if not written.written or written.item is None:
            return None
        return TaskRecord.from_item(written.item)

    def reset_for_redrive(self, tenant: str, request_id: str) -> TaskRecord | None:
        """Give a dead-lettered task a fresh attempt budget: back to PENDING, attempt 0.

        Refused (None) for a COMPLETED or CANCELLED task, or while a lease is live:
        replaying must never re-run finished work or race a running attempt.
        """
        now = now_ms()
        resettable = (TaskState.PENDING, TaskState.RETRYING, TaskState.PROCESSING,
                      TaskState.FAILED, TaskState.TIMEOUT)  # fmt: skip
        write_id = uuid.uuid4().hex
        attrs = values(
            pending=TaskState.PENDING.value,
            processing=TaskState.PROCESSING.value,
            zero=0,
            now=now,
            wid=write_id,
            spk=keys.status_pk(TaskState.PENDING.value, request_id),
            ssk=keys.status_sk(now, tenant, request_id),
        )
        placeholders = []
        for index, state in enumerate(resettable):
            attrs[f":r{index}"] = serialize(state.value)
            placeholders.append(f":r{index}")
        written = idempotent.update(
            self._ddb,
            mark=(idempotent.WRITE_ID, write_id),
            TableName=self._table,
            Key=self._key(tenant, request_id),
            UpdateExpression=(
                "SET #state = :pending, #attempt = :zero, updatedAt = :now, "
                "redrivenAt = :now, statusPK = :spk, statusSK = :ssk, #wid = :wid "
                "REMOVE effectiveUntil, leaseToken, finishedAt, retryAt, deadlineAt, "
                "dlqReturns, dlqReturnOf"
            ),
            ConditionExpression=(
                f"attribute_exists(PK) AND #state IN ({', '.join(placeholders)}) "
                "AND NOT (#state = :processing AND effectiveUntil >= :now)"
            ),
            ExpressionAttributeNames={
                "#state": "state",
                "#attempt": "attempt",
                "#wid": idempotent.WRITE_ID,
            },
            ExpressionAttributeValues=attrs,
            ReturnValues="ALL_NEW",
        )
        if not written.written or written.item is None:
            return None
        return TaskRecord.from_item(written.item)

    # -- queries ----------------------------------------------------------------------
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

    @staticmethod
    def _job_keys(envelope: TaskEnvelope) -> dict[str, Any]:
        if not envelope.job_id:
            return {}
        return {
            "jobId": envelope.job_id,
            "jobPK": keys.job_pk(envelope.tenant, envelope.job_id),
            "jobSK": f"TASK#{envelope.task_key or envelope.request_id}",
        }
