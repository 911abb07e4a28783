"""STATE-item transitions of delayed tasks and of cancel requests.

A delayed task waits as SCHEDULED with `notBefore` (its status-index due time), and
the lock refuses it until then. Cancelling is one conditional write: a task not started
goes straight to CANCELLED (its `Task Cancelled` stored on the item before it is
published); a running one gets `cancelRequested`, which makes its worker's next lease
renewal fail in a way the worker recognises (the refused item comes back with the
failure, so noticing costs no read), and that worker ends the attempt CANCELLED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from botocore.exceptions import ClientError

from agentq.envelope import TaskEnvelope
from agentq.errors import LockNotAcquired, NotCancellable
from agentq.events import event_of, now_ms
from agentq.states import TaskState
from agentq.store import idempotent
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values
from agentq.store.tasks import TaskRecord, TaskStore

NOT_STARTED: Final = frozenset(
    {TaskState.BLOCKED, TaskState.SCHEDULED, TaskState.PENDING, TaskState.RETRYING}
)
CancelOutcome = Literal["cancelled", "requested"]


@dataclass(frozen=True)
class CancelResult:
    outcome: CancelOutcome
    record: TaskRecord


def not_yet_due(store: TaskStore, envelope: TaskEnvelope) -> TaskRecord:
    """A message received before its task's time: never an attempt.

    A message that did not come through agentq's submit (a `Task Requested` event, a
    foreign sender) has no STATE item yet: it gets a SCHEDULED one, so `agentq status`
    shows it and it can be cancelled. Returns the task's record (maybe finished).
    """
    record, _ = store.create(envelope, state=TaskState.SCHEDULED)
    return record


def cancelled_event_detail(record: TaskRecord, reason: str) -> dict[str, Any]:
    return event_of(
        "Task Cancelled", record, reason=reason, task_key=record.raw.get("taskKey")
    ).to_detail()


def cancel_orphan(store: TaskStore, tenant: str, request_id: str) -> bool:
    """A cancel was requested and no attempt holds the task any more (its worker died,
    or the attempt ended retryable or was given back): the cancel ends the task.

    True once the task is terminal (by this call or another). Idempotent: a retried
    transition recognises its own write, and a second caller finds the task terminal.
    """
    record = store.get(tenant, request_id)
    if record is None or record.state.terminal:
        return record is not None
    if not record.raw.get("cancelRequested"):
        return False  # redriven meanwhile (which clears the flag): not ours to end
    reason = str(record.raw.get("cancelReason") or "cancelled by request")
    store.transition(
        record.tenant,
        record.request_id,
        from_states=NOT_STARTED | {TaskState.PROCESSING},
        to_state=TaskState.CANCELLED,
        fields={"terminalEvent": cancelled_event_detail(record, reason)},
        unless_lease_live=True,
    )
    current = store.get(record.tenant, record.request_id)
    return current is not None and current.state.terminal


def request_cancel(
    store: TaskStore, dynamodb: Any, table: str, record: TaskRecord, reason: str
) -> CancelResult:
    """Cancel one task: CANCELLED now if it has not started, else flag the running attempt.

    Every write is conditional on the state it was decided from; a lost race reads the
    item again and decides anew (a few rounds at most: each one moves the task forward).
    """
    for _ in range(4):
        if record.state.terminal:
            raise NotCancellable(record.request_id, record.state.value)
        now = now_ms()
        fields = {"cancelReason": reason, "cancelRequestedAt": now}
        if record.state in NOT_STARTED or not record.lease_live(now):
            # A PROCESSING task whose lease lapsed has no worker left to stop it.
            moved = store.transition(
                record.tenant,
                record.request_id,
                from_states=NOT_STARTED | {TaskState.PROCESSING},
                to_state=TaskState.CANCELLED,
                fields={**fields, "terminalEvent": cancelled_event_detail(record, reason)},
                unless_lease_live=True,
            )
            if moved is not None:
                return CancelResult("cancelled", moved)
        elif _flag_running(dynamodb, table, record, fields):
            return CancelResult("requested", store.require(record.tenant, record.request_id))
        record = store.require(record.tenant, record.request_id)
    raise LockNotAcquired(record.request_id, record.state.value, "cancel kept losing races")


def _flag_running(dynamodb: Any, table: str, record: TaskRecord, fields: Mapping[str, Any]) -> bool:
    # Conditional on the lease seen: a newer attempt is decided afresh by the caller. A
    # retry of an applied write meets the same condition and writes the same flag again.
    try:
        idempotent.retry_conflicts(lambda: dynamodb.update_item(
            TableName=table,
            Key={"PK": {"S": record.raw["PK"]}, "SK": {"S": record.raw["SK"]}},
            UpdateExpression=(
                "SET cancelRequested = :yes, cancelReason = if_not_exists(cancelReason, :reason), "
                "cancelRequestedAt = if_not_exists(cancelRequestedAt, :at)"
            ),
            ConditionExpression="#state = :processing AND leaseToken = :token",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues=values(
                yes=True,
                reason=fields["cancelReason"],
                at=fields["cancelRequestedAt"],
                processing=TaskState.PROCESSING.value,
                token=record.lease_token,
            ),
        ))  # fmt: skip
    except ClientError as error:
        if condition_failed(error):
            return False
        raise
    return True
