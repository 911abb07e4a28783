"""The mark a waiting task's live message leaves on its STATE item: `waitSeenAt`.

A task whose tenant is at its limit keeps its due time while its message waits in a
worker or goes round, so by time alone it looks lost. A worker that parks it or sends
it back writes `waitSeenAt` (one conditional UpdateItem on a task that still waits;
idempotent under retries; at most once per `every_s` per task, `WaitMarks`), and the
reconciler counts it lost only once that mark is older than its bound too. A mark that
cannot be written is only logged: at worst the lock runs the reconciler's copy once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values

logger = logging.getLogger(__name__)

WAIT_SEEN_AT: Final = "waitSeenAt"
# The longest a worker lets a waiting task's mark age: far below any sensible
# RECONCILE_LOST_AFTER (the stages refuse less than 900 s), so a task going round is
# re-marked well before the reconciler would count it lost.
MARK_EVERY_MAX_S: Final = 60.0
# Marks remembered per worker before the oldest are forgotten (forgetting one costs
# at most one extra write).
REMEMBERED: Final = 10_000
WAITING_STATES: Final = (TaskState.PENDING, TaskState.RETRYING, TaskState.SCHEDULED)


def mark_every_s(lost_after_s: float) -> float:
    """How often a worker re-marks a waiting task: a quarter of the reconciler's bound,
    at most a minute."""
    return min(MARK_EVERY_MAX_S, lost_after_s / 4)


def seen_waiting_since(raw: Mapping[str, Any], bound_ms: int) -> bool:
    """Whether a STATE item (decoded) was marked waiting at or after `bound_ms`."""
    at = raw.get(WAIT_SEEN_AT)
    return isinstance(at, int) and not isinstance(at, bool) and at >= bound_ms


def mark_waiting(dynamodb: Any, table_name: str, tenant: str, request_id: str, at_ms: int) -> bool:
    """Write the mark; False when the task no longer waits (or does not exist)."""
    try:
        dynamodb.update_item(
            TableName=table_name,
            Key={"PK": {"S": keys.task_pk(tenant, request_id)}, "SK": {"S": keys.STATE_SK}},
            UpdateExpression=f"SET {WAIT_SEEN_AT} = :at",
            ConditionExpression="attribute_exists(PK) AND #state IN (:p, :r, :s)",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues=values(
                at=at_ms, p=WAITING_STATES[0].value, r=WAITING_STATES[1].value,
                s=WAITING_STATES[2].value,
            ),
        )  # fmt: skip
    except ClientError as error:
        if condition_failed(error):
            return False
        raise
    return True


class WaitMarks:
    """One worker's marks: at most one write per task per `every_s`; thread-safe."""

    def __init__(
        self,
        dynamodb: Any,
        table_name: str,
        *,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = now_ms,
    ) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._every_s = every_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._lock = threading.Lock()
        self._marked: dict[tuple[str, str], float] = {}  # insertion order: oldest first
        self.writes = 0

    def mark(self, tenant: str, request_id: str) -> None:
        """The task's message is live and waiting: mark it, unless marked lately here."""
        key = (tenant, request_id)
        now = self._clock()
        with self._lock:
            last = self._marked.get(key)
            if last is not None and now - last < self._every_s:
                return
            self._marked.pop(key, None)
            self._marked[key] = now
            while len(self._marked) > REMEMBERED:
                del self._marked[next(iter(self._marked))]
            self.writes += 1
        try:
            mark_waiting(self._ddb, self._table, tenant, request_id, self._wall_ms())
        except (ClientError, BotoCoreError) as error:
            with self._lock:
                self._marked.pop(key, None)  # try again at its next turn
            logger.warning("could not mark a waiting task: %s", error,
                           extra={"requestId": request_id, "tenant": tenant})  # fmt: skip
