"""Lost messages: live tasks that no message will ever bring to a worker again.

SQS cannot be asked whether a message for a task exists, so "no message" is decided
by time: a message that exists becomes visible within the queue's visibility timeout
(or the retry backoff a worker set), and a worker that receives it moves the task. A
task still due after `lost_after` longer than that has no message:

- PENDING, created (or unblocked, or redriven) longer ago than the bound;
- SCHEDULED, its `notBefore` longer ago than the bound (before that, its message is
  rightly invisible: SQS DelaySeconds or a worker's re-delay);
- RETRYING, its retry time longer ago than the bound;
- PROCESSING, its lease lapsed longer ago than the bound (the holder died and its
  message was lost or dead-lettered while the lease was live).

The repair sends a fresh copy of the stored envelope. That is always safe: the lock
runs a task once however many messages name it, and a copy that finds the task
finished is deleted. The bound only trades duplicate messages against recovery time.

Each repair is claimed first with one conditional write on the STATE item (`repairedAt`
and a `repairToken`, valid only if the task is still in the state and at the due time
that was read, and was not repaired within the bound), so overlapping runs repair a
task once, and a run repeated within the bound repairs nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.envelope import TaskEnvelope
from agentq.errors import AgentqError
from agentq.events import task_event
from agentq.publisher import EventPublisher
from agentq.reconcile.model import Repair, RepairKind
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore, keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values

logger = logging.getLogger(__name__)

_WATCHED: Final[Sequence[tuple[TaskState, RepairKind]]] = (
    (TaskState.PENDING, "pending_lost"),
    # Due at its notBefore (the status index's due time): lost only once that has
    # passed by the bound, and repaired as a pending task would be.
    (TaskState.SCHEDULED, "pending_lost"),
    (TaskState.RETRYING, "retrying_lost"),
    (TaskState.PROCESSING, "lease_lapsed"),
)
AWS_ERRORS: Final = (ClientError, BotoCoreError)
# Oldest first, per state and run: a backlog that outgrew the bound (workers down for
# an hour) is re-sent over several runs instead of in one that outlives its timeout.
MAX_PER_STATE: Final = 1000


class LostMessages:
    """Finds and re-sends. Clients are passed in; `now` is a parameter of `run`."""

    def __init__(
        self,
        *,
        tasks: TaskStore,
        dynamodb: Any,
        table_name: str,
        sqs: Any,
        queue_url: str,
        publisher: EventPublisher,
        lost_after_s: int,
    ) -> None:
        self._tasks = tasks
        self._ddb = dynamodb
        self._table = table_name
        self._sqs = sqs
        self._queue_url = queue_url
        self._publisher = publisher
        self._lost_after_ms = lost_after_s * 1000

    def run(self, now: int, repairs: list[Repair], errors: list[str]) -> None:
        bound = now - self._lost_after_ms
        for state, kind in _WATCHED:
            try:
                found = self._tasks.tasks_by_status(state, due_before_ms=bound, limit=MAX_PER_STATE)
            except AWS_ERRORS as error:
                errors.append(f"{state.value}: status index unreadable: {error}")
                continue
            for record in found:
                if _repaired_since(record, bound):
                    continue  # repaired within the bound: give that copy its chance
                try:
                    repair = self._repair(record, kind, now, bound)
                except (AgentqError, *AWS_ERRORS) as error:
                    errors.append(f"{record.request_id}: {error}")
                    continue
                if repair is not None:
                    repairs.append(repair)

    def _repair(self, record: TaskRecord, kind: RepairKind, now: int, bound: int) -> Repair | None:
        if record.envelope is None:
            # Written by a producer that stores no envelope: nothing to re-send from.
            logger.warning("cannot re-send %s: its STATE item holds no envelope", record)
            return None
        envelope = TaskEnvelope.from_dict(record.envelope, default_tenant=record.tenant)
        token = uuid.uuid4().hex
        if not self._claim(record, token, now, bound):
            return None
        try:
            self._sqs.send_message(QueueUrl=self._queue_url, **envelope.send_fields())
        except AWS_ERRORS:
            # Give the claim back, so the next run repairs it instead of waiting a bound.
            self._release(record, token)
            raise
        detail = _describe(record, kind, now)
        self._publisher.publish(
            task_event(
                "Task Repaired",
                request_id=record.request_id,
                tenant=record.tenant,
                job_id=record.job_id,
                attempt=record.attempt,
                definition=record.definition,
                repair=kind,
                observedState=record.state.value,
                detail=detail,
                repairToken=token,
            )
        )
        return Repair(kind=kind, tenant=record.tenant, subject=record.request_id,
                      job_id=record.job_id, detail=detail)  # fmt: skip

    def _claim(self, record: TaskRecord, token: str, now: int, bound: int) -> bool:
        sort_key = record.raw.get("statusSK")
        if not isinstance(sort_key, str):
            return False
        key = _key(record)
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression="SET repairedAt = :now, repairToken = :token ADD repairs :one",
                # Still where it was read: same state, same due time (a new lease or
                # retry moves statusSK), and not repaired within the bound.
                ConditionExpression=(
                    "#state = :state AND statusSK = :ssk "
                    "AND (attribute_not_exists(repairedAt) OR repairedAt < :bound)"
                ),
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues=values(
                    now=now,
                    token=token,
                    one=1,
                    state=record.state.value,
                    ssk=sort_key,
                    bound=bound,
                ),
            )
        except ClientError as error:
            if not condition_failed(error):
                raise
            # botocore may have retried a claim that was applied: then it is ours.
            current = self._tasks.get(record.tenant, record.request_id)
            return current is not None and current.raw.get("repairToken") == token
        return True

    def _release(self, record: TaskRecord, token: str) -> None:
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key=_key(record),
                UpdateExpression="REMOVE repairedAt, repairToken ADD repairs :minus",
                ConditionExpression="repairToken = :token",
                ExpressionAttributeValues=values(token=token, minus=-1),
            )
        except ClientError as error:
            if not condition_failed(error):
                logger.warning("could not release the repair claim on %s: %s", record, error)
        except BotoCoreError as error:
            logger.warning("could not release the repair claim on %s: %s", record, error)


def _repaired_since(record: TaskRecord, bound: int) -> bool:
    at = record.raw.get("repairedAt")
    return isinstance(at, int) and at >= bound


def _key(record: TaskRecord) -> dict[str, Any]:
    return {
        "PK": {"S": keys.task_pk(record.tenant, record.request_id)},
        "SK": {"S": keys.STATE_SK},
    }


def _describe(record: TaskRecord, kind: RepairKind, now: int) -> str:
    if kind == "lease_lapsed":
        lapsed = (now - (record.effective_until_ms or now)) // 1000
        return (
            f"attempt {record.attempt} of {record.owner}: lease lapsed {lapsed}s ago, "
            "no worker took it over; message re-sent"
        )
    sort_key = str(record.raw.get("statusSK", ""))
    due = int(sort_key[:15]) if sort_key[:15].isdigit() else now
    return (
        f"{record.state.value} for {(now - due) // 1000}s with no worker taking it; message re-sent"
    )
