"""Task transitions: an attempt's end (conditional on its lease token), the lease-free
moves between states, and the redrive reset. Each is one conditional UpdateItem.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal, overload

from botocore.exceptions import ClientError

from agentq.errors import CancelRequested, LeaseLost
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys, transact
from agentq.store.codec import serialize, values
from agentq.store.leases import Lease, cancel_flagged
from agentq.store.records import ATTEMPT_ALLOWANCE, TaskRecord
from agentq.store.tenants import TenantLimitStore


class TaskTransitions:
    """The state-changing part of `TaskStore`."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

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
        attempt; raises `LeaseLost` then. RETRYING is refused once a cancel was
        requested (`CancelRequested`: the caller ends the attempt CANCELLED instead, so a
        cancel answered "requested" never meets a new attempt). Returns the settled record.
        """
        return self._end(lease, state, retry_at_ms, fields, read_back=True)

    def end_attempt(
        self,
        lease: Lease,
        state: TaskState,
        *,
        retry_at_ms: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """`finalize` for a caller that does not read the settled record (the worker):
        an attempt that held a tenant seat then costs its transaction alone, without the
        strongly consistent read a transaction needs to return the record."""
        self._end(lease, state, retry_at_ms, fields, read_back=False)

    @overload
    def _end(
        self,
        lease: Lease,
        state: TaskState,
        retry_at_ms: int | None,
        fields: Mapping[str, Any] | None,
        *,
        read_back: Literal[True],
    ) -> TaskRecord: ...

    @overload
    def _end(
        self,
        lease: Lease,
        state: TaskState,
        retry_at_ms: int | None,
        fields: Mapping[str, Any] | None,
        *,
        read_back: Literal[False],
    ) -> None: ...

    def _end(
        self,
        lease: Lease,
        state: TaskState,
        retry_at_ms: int | None,
        fields: Mapping[str, Any] | None,
        *,
        read_back: bool,
    ) -> TaskRecord | None:
        """The attempt's end; the settled record with `read_back` (the one plain update
        returns it anyway, a seated transaction then reads it), else None."""
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
        condition = "leaseToken = :token AND #state = :processing"
        if state is TaskState.RETRYING:
            # A cancel flagged while the attempt ran wins over its retry.
            condition += " AND attribute_not_exists(cancelRequested)"
        request = {
            "TableName": self._table,
            "Key": keys.state_key(lease.tenant, lease.request_id),
            "UpdateExpression": f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": attrs,
        }
        if lease.seat is not None:
            ended, record = self._finalize_seated(lease, request, read_back=read_back)
            if ended:
                return record if read_back else None
        written = idempotent.update(
            self._ddb, mark=("finalizedBy", lease.token), ReturnValues="ALL_NEW", **request
        )
        if not written.written or written.item is None:
            if cancel_flagged(lease, written.item):
                raise CancelRequested(lease.request_id)
            raise LeaseLost(lease.request_id, lease.token)
        return TaskRecord.from_item(written.item) if read_back else None

    def _finalize_seated(
        self, lease: Lease, request: dict[str, Any], *, read_back: bool
    ) -> tuple[bool, TaskRecord | None]:
        """End the attempt and free its tenant seat in one transaction: whether it
        ended, and the settled record if known.

        Not ended when the seat is no longer this lease's (it lapsed and another task
        took it): the caller then ends the attempt alone. A transaction returns no item,
        so with `read_back` the settled record is read (strongly consistent).
        """
        seat = TenantLimitStore(self._ddb, self._table).free(
            lease.tenant, lease.seat or 0, token=lease.token
        )
        try:
            transact.write(self._ddb, [
                {"Update": {**request, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}},
                {"Update": seat},
            ])  # fmt: skip
        except ClientError as error:
            found = transact.reasons(error)
            if found is None:
                raise
            if transact.code(found, 0) == transact.CONDITION:
                item = found[0].get("Item")
                # A retry of our own applied finalize finds its mark; anything else is a
                # newer attempt's lease.
                if idempotent.carries(item, ("finalizedBy", lease.token)) and item:
                    return True, TaskRecord.from_item(item)
                if cancel_flagged(lease, item):
                    raise CancelRequested(lease.request_id) from None
                raise LeaseLost(lease.request_id, lease.token) from None
            if transact.code(found, 1) == transact.CONDITION:
                return False, None
            raise
        if not read_back:
            return True, None
        item = self._ddb.get_item(
            TableName=self._table, Key=request["Key"], ConsistentRead=True
        ).get("Item")
        if not item:  # pragma: no cover - the transaction has just written it
            raise LeaseLost(lease.request_id, lease.token)
        return True, TaskRecord.from_item(item)

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
            Key=keys.state_key(tenant, request_id),
            UpdateExpression=expression,
            ConditionExpression=f"attribute_exists(PK) AND {condition}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=attrs,
            ReturnValues="ALL_NEW",
        )
        if not written.written or written.item is None:
            return None
        return TaskRecord.from_item(written.item)

    def reset_for_retry(self, tenant: str, request_id: str, *, write_id: str) -> TaskRecord | None:
        """An operator's retry of a FAILED or TIMEOUT task: PENDING, attempt 0, as a
        redrive does, but only from those two states, and marked with `write_id` so the
        same retry sent twice is one (agentq.jobs.retry). None when refused."""
        now = now_ms()
        written = idempotent.update(
            self._ddb,
            mark=(idempotent.WRITE_ID, write_id),
            TableName=self._table,
            Key=keys.state_key(tenant, request_id),
            UpdateExpression=(
                "SET #state = :pending, #attempt = :zero, updatedAt = :now, "
                "retriedAt = :now, statusPK = :spk, statusSK = :ssk, #wid = :wid "
                "REMOVE effectiveUntil, leaseToken, finishedAt, retryAt, deadlineAt, "
                f"dlqReturns, dlqReturnOf, cancelRequested, {ATTEMPT_ALLOWANCE}"
            ),
            ConditionExpression="attribute_exists(PK) AND #state IN (:failed, :timeout)",
            ExpressionAttributeNames={"#state": "state", "#attempt": "attempt",
                                      "#wid": idempotent.WRITE_ID},
            ExpressionAttributeValues=values(
                pending=TaskState.PENDING.value, failed=TaskState.FAILED.value,
                timeout=TaskState.TIMEOUT.value, zero=0, now=now, wid=write_id,
                spk=keys.status_pk(TaskState.PENDING.value, request_id),
                ssk=keys.status_sk(now, tenant, request_id),
            ),
            ReturnValues="ALL_NEW",
        )  # fmt: skip
        if not written.written or written.item is None:
            return None
        return TaskRecord.from_item(written.item)

    def reset_for_redrive(self, tenant: str, request_id: str) -> TaskRecord | None:
        """Give a dead-lettered task a fresh attempt budget: back to PENDING, attempt 0.

        Refused (None) for a COMPLETED or CANCELLED task, or while a lease is live:
        replaying must never re-run finished work or race a running attempt. A cancel
        flag left by an attempt that ended otherwise (FAILED, say) is cleared: the
        operator's redrive is a new request, which the lock would refuse with it.
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
            Key=keys.state_key(tenant, request_id),
            UpdateExpression=(
                "SET #state = :pending, #attempt = :zero, updatedAt = :now, "
                "redrivenAt = :now, statusPK = :spk, statusSK = :ssk, #wid = :wid "
                "REMOVE effectiveUntil, leaseToken, finishedAt, retryAt, deadlineAt, "
                f"dlqReturns, dlqReturnOf, cancelRequested, {ATTEMPT_ALLOWANCE}"
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
