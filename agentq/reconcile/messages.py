"""Lost messages: live tasks that no message will ever bring to a worker again.

A task still due (PENDING or SCHEDULED since its due time, RETRYING since its retry
time, PROCESSING since its lease lapsed) for longer than `lost_after`, and not marked
waiting by a worker (`waitSeenAt`, agentq.store.waiting) within it, has no message.
Each run reads the watched partitions of the status index through cursors
(agentq.reconcile.cursor); each repair is claimed by one conditional write on the STATE
item (`repairedAt`, `repairToken`), then sends a fresh copy of the stored envelope,
which the lock runs once however many copies exist. docs/architecture.md, "Reconciler",
has the promise and its bounds.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.envelope import TaskEnvelope
from agentq.errors import AgentqError
from agentq.events import event_of
from agentq.publisher import EventPublisher
from agentq.reconcile.cursor import Cursors
from agentq.reconcile.model import Repair, RepairKind
from agentq.resources import STATUS_SHARDS
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore, keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values
from agentq.store.waiting import WAIT_SEEN_AT, seen_waiting_since

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
# Items read per partition and run (RECONCILE_PAGE_SIZE's default): four partitions a
# state, so a run re-sends at most 1,000 tasks of a state, and a backlog that outgrew
# the bound (workers down for an hour) is re-sent over several runs instead of in one
# that outlives its timeout.
DEFAULT_PAGE_SIZE: Final = 250


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
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        self._tasks = tasks
        self._ddb = dynamodb
        self._table = table_name
        self._sqs = sqs
        self._queue_url = queue_url
        self._publisher = publisher
        self._lost_after_ms = lost_after_s * 1000
        self._page_size = page_size
        self.cursors = Cursors(dynamodb, table_name)

    def run(self, now: int, repairs: list[Repair], errors: list[str]) -> None:
        bound = now - self._lost_after_ms
        watched = [
            (keys.status_partition(state.value, shard), kind)
            for state, kind in _WATCHED
            for shard in range(STATUS_SHARDS)
        ]
        kinds = dict(watched)

        def visit(partition: str, items: list[dict[str, Any]]) -> None:
            for item in items:
                self._check(item, kinds[partition], now, bound, repairs, errors)

        self.cursors.walk([partition for partition, _ in watched], bound=keys.due_bound(bound),
                          limit=self._page_size, now_ms=now, errors=errors, visit=visit)  # fmt: skip

    def _check(
        self,
        item: dict[str, Any],
        kind: RepairKind,
        now: int,
        bound: int,
        repairs: list[Repair],
        errors: list[str],
    ) -> None:
        try:
            record = TaskRecord.from_item(item)
        except (KeyError, TypeError, ValueError) as error:
            # Another writer's malformed item: reported, and passed by like any other.
            errors.append(f"unreadable STATE item in the status index: {error!r}")
            return
        if _repaired_since(record, bound):
            return  # repaired within the bound: give that copy its chance
        if seen_waiting_since(record.raw, bound):
            return  # its message went round lately: it waits, it is not lost
        try:
            repair = self._repair(record, kind, now, bound)
        except (AgentqError, *AWS_ERRORS) as error:
            # Tried again when the cursor next passes it (the next run, if the
            # partition's backlog fits one page).
            errors.append(f"{record.request_id}: {error}")
            return
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
            event_of(
                "Task Repaired",
                record,
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
                # retry moves statusSK), not repaired within the bound, and its message
                # not seen waiting since (the index read lags the worker's mark).
                ConditionExpression=(
                    "#state = :state AND statusSK = :ssk "
                    "AND (attribute_not_exists(repairedAt) OR repairedAt < :bound) "
                    f"AND (attribute_not_exists({WAIT_SEEN_AT}) OR {WAIT_SEEN_AT} < :bound)"
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
