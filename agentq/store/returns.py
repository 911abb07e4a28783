"""The STATE item's count of dead letters returned to the task queue.

SQS dead-letters a message after `maxReceiveCount` receives, and receives are not
attempts: a killed worker's prefetched messages, a lost ReceiveMessage answer and a
refusal backed off in place each spend one. The DLQ processor sends such a task back
(agentq/dlq/returns.py) and counts it here, one conditional write per return, so a
message no worker can ever settle still ends after a bounded number of returns.

The write carries the dead letter's MessageId as its mark: botocore's retry of an
applied write recognises itself (agentq.store.idempotent), and a redelivery of the same
dead letter (the Lambda died between this write and its SendMessage) finds the mark
and sends again without counting twice.
"""

from __future__ import annotations

from typing import Any, Final

from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys
from agentq.store.codec import values
from agentq.store.records import ATTEMPT_ALLOWANCE
from agentq.store.tasks import TaskRecord

DLQ_RETURNS: Final = "dlqReturns"
RETURNED_LETTER: Final = "dlqReturnOf"
RETURNED_AT: Final = "dlqReturnedAt"
MAX_ATTEMPTS: Final = "maxAttempts"
# Waiting states: a SCHEDULED task's message is re-delayed receive after receive until
# its time, so its dead letter goes back too (its notBefore kept, on the item and in the
# body) rather than failing a task that never ran.
RETURNABLE_STATES: Final = (TaskState.SCHEDULED, TaskState.PENDING, TaskState.RETRYING)


def returns_of(record: TaskRecord) -> int:
    value = record.raw.get(DLQ_RETURNS)
    return int(value) if isinstance(value, int) else 0


def returned_letter(record: TaskRecord) -> str | None:
    value = record.raw.get(RETURNED_LETTER)
    return value if isinstance(value, str) else None


def returned_at(record: TaskRecord) -> int | None:
    """When the last return was counted (epoch ms): its copy was sent after it."""
    value = record.raw.get(RETURNED_AT)
    return value if isinstance(value, int) else None


def attempts_left(record: TaskRecord, at_ms: int | None = None) -> bool:
    """Whether a worker may still lock the task: waiting (or its holder's lease lapsed)
    and attempts remain (its budget, or its allowance: agentq.store.records). A task
    acquired before `maxAttempts` was recorded counts as having attempts left only if
    it never ran (attempt 0) or a release allows it more."""
    waiting = record.state in RETURNABLE_STATES or (
        record.state is TaskState.PROCESSING and not record.lease_live(at_ms)
    )
    budget = record.raw.get(MAX_ATTEMPTS)
    if isinstance(budget, int):
        return waiting and record.attempt < record.attempt_budget(budget)
    return waiting and (record.attempt == 0 or record.attempt < record.attempt_allowance)


def count_return(dynamodb: Any, table_name: str, record: TaskRecord, *, message_id: str) -> bool:
    """Count one return of `record`'s task for the dead letter `message_id`.

    Conditional on the count read (so two processors cannot both count from the same
    value) and on the task still having attempts left. False when refused: the task
    moved on (a worker locked it, it ended, another dead letter was counted first).
    """
    seen = returns_of(record)
    now = now_ms()
    counted = f"{DLQ_RETURNS} = :seen" if seen else f"attribute_not_exists({DLQ_RETURNS})"
    written = idempotent.update(
        dynamodb,
        mark=(RETURNED_LETTER, message_id),
        TableName=table_name,
        Key={
            "PK": {"S": keys.task_pk(record.tenant, record.request_id)},
            "SK": {"S": keys.STATE_SK},
        },
        UpdateExpression=(
            f"SET {DLQ_RETURNS} = :next, {RETURNED_LETTER} = :mid, {RETURNED_AT} = :now, "
            "updatedAt = :now"
        ),
        ConditionExpression=(
            "attribute_exists(PK) AND (#state IN (:scheduled, :pending, :retrying) "
            "OR (#state = :processing AND effectiveUntil < :now)) "
            f"AND ((attribute_not_exists({MAX_ATTEMPTS}) AND "
            "(attribute_not_exists(#attempt) OR #attempt = :zero)) "
            f"OR #attempt < {MAX_ATTEMPTS} OR #attempt < {ATTEMPT_ALLOWANCE}) AND {counted}"
        ),
        ExpressionAttributeNames={"#state": "state", "#attempt": "attempt"},
        ExpressionAttributeValues=values(
            scheduled=TaskState.SCHEDULED.value,
            pending=TaskState.PENDING.value,
            retrying=TaskState.RETRYING.value,
            processing=TaskState.PROCESSING.value,
            zero=0,
            now=now,
            next=seen + 1,
            mid=message_id,
            **({"seen": seen} if seen else {}),
        ),
        ReturnValues="ALL_NEW",
    )
    return written.written
