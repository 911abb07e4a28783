"""The fleet's roster: one item per worker, which the worker rewrites every half minute
(`ANNOUNCE_EVERY_MS`) with its slots, busy slots and version, and marks stopped when it
ends. It is how `agentq stats` and the console's Queues page see idle workers and gone
ones, which no task event names.

`PK = WORKERS`, `SK = <worker id>`; no index key, so nothing of it reaches an index, and
a TTL a week after the last announcement. A write is a plain `PutItem` of the worker's
whole entry: a retried one (throttled, or failed after it was applied) writes the same
values again, and a worker that dies between two announcements is "gone" once
`GONE_AFTER_MS` has passed without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from agentq.resources import ROSTER_PK
from agentq.store.codec import from_item, to_item

ANNOUNCE_EVERY_MS: Final = 30_000
# Four announcements missed: a worker killed without a word (SIGKILL, a lost host).
GONE_AFTER_MS: Final = 4 * ANNOUNCE_EVERY_MS
TTL_S: Final = 7 * 24 * 3600
MAX_PAGES: Final = 10

WorkerStatus = Literal["busy", "idle", "stopped", "gone"]


@dataclass(frozen=True)
class WorkerEntry:
    worker: str
    slots: int
    busy: int
    version: str
    started_ms: int
    seen_ms: int
    stopped: bool = False

    def status(self, now_ms: int) -> WorkerStatus:
        if self.stopped:
            return "stopped"
        if now_ms - self.seen_ms > GONE_AFTER_MS:
            return "gone"
        return "busy" if self.busy > 0 else "idle"

    def to_json(self, now_ms: int) -> dict[str, Any]:
        return {"worker": self.worker, "slots": self.slots, "busy": self.busy,
                "version": self.version, "startedMs": self.started_ms,
                "lastSeenMs": self.seen_ms, "status": self.status(now_ms)}  # fmt: skip


class WorkerRoster:
    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def announce(self, entry: WorkerEntry) -> None:
        item = {
            "PK": ROSTER_PK,
            "SK": entry.worker,
            "slots": entry.slots,
            "busy": entry.busy,
            "version": entry.version,
            "startedAt": entry.started_ms,
            "seenAt": entry.seen_ms,
            "stopped": entry.stopped,
            "ttl": entry.seen_ms // 1000 + TTL_S,
        }
        self._ddb.put_item(TableName=self._table, Item=to_item(item))

    def entries(self) -> list[WorkerEntry]:
        """Every worker the table remembers (a week), by id; at most MAX_PAGES pages."""
        found: list[WorkerEntry] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "PK = :pk",
            "ExpressionAttributeValues": {":pk": {"S": ROSTER_PK}},
        }
        for _ in range(MAX_PAGES):
            response = self._ddb.query(**kwargs)
            for item in response.get("Items", []):
                entry = _entry(from_item(item))
                if entry is not None:
                    found.append(entry)
            if "LastEvaluatedKey" not in response:
                break
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return sorted(found, key=lambda e: e.worker)


def _entry(item: dict[str, Any]) -> WorkerEntry | None:
    try:
        return WorkerEntry(
            worker=str(item["SK"]),
            slots=int(item["slots"]),
            busy=int(item["busy"]),
            version=str(item.get("version") or "?"),
            started_ms=int(item["startedAt"]),
            seen_ms=int(item["seenAt"]),
            stopped=bool(item.get("stopped")),
        )
    except (KeyError, TypeError, ValueError):
        return None  # written by hand or by another version: not a worker we can show


class RosterAnnouncer:
    """The worker's side: `tick()` from its main loop (announces at most every
    ANNOUNCE_EVERY_MS), `stopped()` once at its end."""

    def __init__(
        self,
        roster: WorkerRoster,
        *,
        worker: str,
        slots: int,
        busy: Callable[[], int],
        version: str,
        clock_ms: Callable[[], int],
    ) -> None:
        self._roster = roster
        self._worker, self._slots, self._busy, self._version = worker, slots, busy, version
        self._clock = clock_ms
        self._started = clock_ms()
        self._last: int | None = None

    def tick(self) -> None:
        now = self._clock()
        if self._last is not None and now - self._last < ANNOUNCE_EVERY_MS:
            return
        self._last = now
        self._roster.announce(self._entry(now, stopped=False))

    def stopped(self) -> None:
        self._roster.announce(self._entry(self._clock(), stopped=True))

    def _entry(self, now: int, *, stopped: bool) -> WorkerEntry:
        return WorkerEntry(worker=self._worker, slots=self._slots,
                           busy=0 if stopped else self._busy(), version=self._version,
                           started_ms=self._started, seen_ms=now, stopped=stopped)  # fmt: skip
