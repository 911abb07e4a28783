"""The task STATE item: `TaskStore` reads and creates it, and is composed of the parts
that own its other concerns: the lock (agentq.store.lock), transitions
(agentq.store.transitions), index queries (agentq.store.queries) and lease renewal
(agentq.store.leases); the record itself is agentq.store.records.

Every decision is one conditional UpdateItem on the STATE item (strongly consistent,
never a GSI read). A refused condition returns the item as it is, and the refusal is
turned into the exception that tells the caller what to do (see agentq.errors).

Each write marks the item (its lease token or a fresh write id) and goes through
agentq.store.idempotent: a retry that meets its own applied write reports success, and
a transaction conflict (the heartbeat's renewal transaction) is retried, not surfaced.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from agentq.envelope import TaskEnvelope
from agentq.errors import NotFound
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys
from agentq.store.codec import to_item
from agentq.store.leases import Lease, LeaseRenewals, Renewals
from agentq.store.lock import TaskLock, job_keys
from agentq.store.queries import TaskQueries
from agentq.store.records import TaskRecord
from agentq.store.transitions import TaskTransitions
from agentq.store.waiting import WaitMarks

__all__ = ["Lease", "Renewals", "TaskRecord", "TaskStore"]


class TaskStore:
    """STATE items of the events table. The DynamoDB client is passed in.

    Each verb is answered by the part that owns it; the parts share only the client
    and the table name.
    """

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self.lock = TaskLock(dynamodb, table_name)
        self.transitions = TaskTransitions(dynamodb, table_name)
        self.queries = TaskQueries(dynamodb, table_name)
        self.leases = LeaseRenewals(dynamodb, table_name)
        self.acquire = self.lock.acquire
        self.tenant_limits = self.lock.tenant_limits
        self.free_seats = self.lock.free_seats
        self.finalize = self.transitions.finalize
        self.end_attempt = self.transitions.end_attempt
        self.transition = self.transitions.transition
        self.reset_for_redrive = self.transitions.reset_for_redrive
        self.reset_for_retry = self.transitions.reset_for_retry
        self.tasks_of_job = self.queries.tasks_of_job
        self.tasks_by_status = self.queries.tasks_by_status
        self.renew = self.leases.renew
        self.renew_many = self.leases.renew_many
        self.renew_leases = self.leases.renew_leases

    def wait_marks(self, *, every_s: float) -> WaitMarks:
        """Marks of tasks waiting with a live message (agentq.store.waiting)."""
        return WaitMarks(self._ddb, self._table, every_s=every_s)

    # -- reading -------------------------------------------------------------------
    def get(self, tenant: str, request_id: str) -> TaskRecord | None:
        response = self._ddb.get_item(
            TableName=self._table,
            Key=keys.state_key(tenant, request_id),
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
            **job_keys(envelope),
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
