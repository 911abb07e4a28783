"""The task lock: one conditional UpdateItem takes a task for an attempt, and a refused
condition is turned into the `LockNotAcquired` subclass that tells the caller what to do.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from agentq.envelope import TaskEnvelope
from agentq.errors import (
    AttemptsExhausted,
    CancelPending,
    LockNotAcquired,
    TaskAlreadyTerminal,
    TaskHeldElsewhere,
    TaskNotReady,
)
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys
from agentq.store.codec import serialize, values
from agentq.store.leases import Lease
from agentq.store.records import ATTEMPT_ALLOWANCE, TaskRecord
from agentq.store.seated import acquire_seated
from agentq.store.tenants import TenantLimitStore, free_seats

# Who may take a task: new, waiting, due, or held by a lapsed lease; attempts left (its
# budget, or its allowance: agentq.store.records); and never a task whose cancel was
# requested, whatever its state: from the moment a caller is told "cancel requested", no
# new attempt starts (the refusal ends it CANCELLED).
LOCK_CONDITION: Final = (
    "(attribute_not_exists(PK) OR ((#state IN (:pending, :retrying) "
    "OR (#state = :scheduled AND notBefore <= :now) "
    "OR (#state = :processing AND effectiveUntil < :now)) "
    "AND attribute_not_exists(cancelRequested))) "
    "AND (attribute_not_exists(#attempt) OR #attempt < :max "
    f"OR #attempt < {ATTEMPT_ALLOWANCE})"
)


class TaskLock:
    """The locking part of `TaskStore`."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def acquire(
        self,
        envelope: TaskEnvelope,
        *,
        worker_id: str,
        lease_seconds: float,
        max_attempts: int,
        timeout_ms: int | None = None,
        tenant_limit: int = 0,
        first_seat: int | None = None,
    ) -> Lease:
        """Take the task's lock for one attempt.

        Allowed when the task is new, PENDING or RETRYING, due SCHEDULED, or PROCESSING
        with an expired lease, no cancel was requested, and attempts remain. Raises a `LockNotAcquired` subclass otherwise. With a
        `tenant_limit` (0: none) the lock also takes one of the tenant's seats, in the
        same transaction (agentq.store.seated); `TenantAtLimit` when none is free.
        `first_seat`: the seat to try first (one seen free), else one spread by request id.
        """
        now = now_ms()
        if envelope.not_before_ms is not None and envelope.not_before_ms > now:
            # Early: never an attempt. The worker records it SCHEDULED if it is not yet
            # (agentq.store.scheduling.not_yet_due) and re-delays the message.
            raise TaskNotReady(envelope.request_id, TaskState.SCHEDULED.value,
                               envelope.not_before_ms)  # fmt: skip
        token = uuid.uuid4().hex
        if tenant_limit > 0:
            return acquire_seated(
                self.tenant_limits(), envelope, token=token, worker_id=worker_id,
                lease_seconds=lease_seconds, max_attempts=max_attempts, limit=tenant_limit,
                first_seat=first_seat, lock_request=lambda at, until: self._lock_request(
                    envelope, token=token, worker_id=worker_id, now=at,
                    effective_until=until, max_attempts=max_attempts, timeout_ms=timeout_ms),
                refusal=lambda item, at: self._refusal(envelope, item, at, max_attempts),
            )  # fmt: skip
        effective_until = now + int(lease_seconds * 1000)
        request = self._lock_request(
            envelope, token=token, worker_id=worker_id, now=now,
            effective_until=effective_until, max_attempts=max_attempts, timeout_ms=timeout_ms,
        )  # fmt: skip
        written = idempotent.update(
            self._ddb, mark=("leaseToken", token), ReturnValues="ALL_NEW", **request
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
            allowance=record.attempt_allowance,
        )

    def _lock_request(
        self,
        envelope: TaskEnvelope,
        *,
        token: str,
        worker_id: str,
        now: int,
        effective_until: int,
        max_attempts: int,
        timeout_ms: int | None,
    ) -> dict[str, Any]:
        """The lock's conditional update of the STATE item (UpdateItem parameters)."""
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
            # sent back rather than failed (agentq/dlq/returns.py).
            "maxAttempts = :max",
        ]
        if timeout_ms:
            sets.append("deadlineAt = :deadline")
        else:
            del attrs[":deadline"]
        for name, value in job_keys(envelope).items():
            attrs[f":{name}"] = serialize(value)
            sets.append(f"{name} = if_not_exists({name}, :{name})")
        return {
            "TableName": self._table,
            "Key": keys.state_key(envelope.tenant, envelope.request_id),
            "UpdateExpression": "SET " + ", ".join(sets),
            "ConditionExpression": LOCK_CONDITION,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": attrs,
        }

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
        if record.raw.get("cancelRequested") and not record.lease_live(now):
            # Flagged while an attempt ran, and that attempt is over (given back, ended
            # retryable, or its worker died): the cancel ends the task, not a new attempt.
            return CancelPending(envelope.request_id, record.state.value)
        if record.state is TaskState.BLOCKED:
            return TaskNotReady(envelope.request_id, record.state.value)
        if record.state is TaskState.SCHEDULED:
            return TaskNotReady(
                envelope.request_id, record.state.value, int(record.raw.get("notBefore") or now)
            )
        if record.lease_live(now):
            return TaskHeldElsewhere(
                envelope.request_id, record.owner, int(record.effective_until_ms or 0)
            )
        if record.attempt >= record.attempt_budget(max_attempts):
            return AttemptsExhausted(envelope.request_id, record.attempt)
        return LockNotAcquired(
            envelope.request_id, record.state.value, "lock refused: task changed concurrently"
        )

    def tenant_limits(self) -> TenantLimitStore:
        """The tenants' limit overrides and seats, in the same table."""
        return TenantLimitStore(self._ddb, self._table)

    def free_seats(self, tenant: str, limit: int) -> list[int]:
        """The seats of `tenant` below `limit` that no live lease holds now: one strongly
        consistent query, a read where a refused lock would spend two writes."""
        return free_seats(self.tenant_limits().seats(tenant), limit, now_ms())


def job_keys(envelope: TaskEnvelope) -> dict[str, Any]:
    """The job index's keys of a task that belongs to a job (none otherwise)."""
    if not envelope.job_id:
        return {}
    return {
        "jobId": envelope.job_id,
        "jobPK": keys.job_pk(envelope.tenant, envelope.job_id),
        "jobSK": f"TASK#{envelope.task_key or envelope.request_id}",
    }
