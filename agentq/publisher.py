"""Publishes agentq events to EventBridge.

- Batches: at most 10 entries and 256 KB per `PutEvents` call.
- Retries entries that fail inside a successful call (`FailedEntryCount`), with
  jittered backoff, a bounded number of times.
- An entry too large for EventBridge has its payload moved to S3 and carries a
  pointer (`payloadPointer`: bucket, key, size) instead.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.backoff import retry_entries
from agentq.errors import AgentqError
from agentq.events import Event
from agentq.resources import EVENT_OVERFLOW_PREFIX

MAX_ENTRIES_PER_CALL: Final = 10
MAX_REQUEST_BYTES: Final = 256 * 1024
# Leave room for the request's own framing when deciding what fits.
MAX_ENTRY_BYTES: Final = MAX_REQUEST_BYTES - 1024

logger = logging.getLogger(__name__)


class PublishError(AgentqError):
    """Some events could not be published after every retry."""

    def __init__(self, failed: list[tuple[str, str]]) -> None:
        self.failed = failed  # (event id, error code)
        super().__init__(f"{len(failed)} event(s) not published: {failed[:3]}")


def entry_size(entry: dict[str, Any]) -> int:
    """EventBridge's size rule: Source + DetailType + Detail (+ Time 14 bytes), UTF-8."""
    size = 14
    for name in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(name, "")).encode())
    for resource in entry.get("Resources", []):
        size += len(resource.encode())
    return size


@dataclass
class PublishStats:
    calls: int = 0
    entries: int = 0
    retried: int = 0
    overflowed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


class EventPublisher:
    """The EventBridge and S3 clients are passed in; nothing is created at import."""

    def __init__(
        self,
        events_client: Any,
        *,
        bus_name: str,
        source: str,
        s3_client: Any = None,
        bucket: str | None = None,
        max_attempts: int = 4,
        backoff_base_s: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._events = events_client
        self._s3 = s3_client
        self._bucket = bucket
        self.bus_name = bus_name
        self.source = source
        self._max_attempts = max_attempts
        self._backoff = backoff_base_s
        self._sleep = sleep
        self.stats = PublishStats()

    def publish(self, *events: Event) -> None:
        self.publish_all(events)

    def publish_all(self, events: Iterable[Event], *, raise_on_failure: bool = True) -> None:
        entries = [self._entry(event) for event in events]
        failed: list[tuple[str, str]] = []
        for batch in _batches(entries):
            failed.extend(self._send(batch))
        if failed:
            self.stats.failed.extend(failed)
            if raise_on_failure:
                raise PublishError(failed)
            logger.error("events not published", extra={"failed": failed})

    def _entry(self, event: Event) -> tuple[str, dict[str, Any]]:
        entry = event.to_entry(source=self.source, bus_name=self.bus_name)
        if entry_size(entry) > MAX_ENTRY_BYTES:
            entry = event.with_pointer(self._overflow(event)).to_entry(
                source=self.source, bus_name=self.bus_name
            )
            self.stats.overflowed += 1
        return event.event_id, entry

    def _overflow(self, event: Event) -> dict[str, Any]:
        if self._s3 is None or not self._bucket:
            raise PublishError([(event.event_id, "PayloadTooLarge: no overflow bucket set")])
        body = json.dumps(dict(event.payload), default=str).encode()
        key = f"{EVENT_OVERFLOW_PREFIX}{event.tenant}/{event.request_id}/{event.event_id}.json"
        self._s3.put_object(Bucket=self._bucket, Key=key, Body=body, ContentType="application/json")
        return {"bucket": self._bucket, "key": key, "size": len(body)}

    def _send(self, batch: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
        calls = 0

        def put(pending: list[tuple[str, dict[str, Any]]]) -> list[tuple[tuple[str, Any], str]]:
            nonlocal calls
            calls += 1
            self.stats.calls += 1
            self.stats.entries += len(pending)
            if calls > 1:
                self.stats.retried += len(pending)
            response = self._events.put_events(Entries=[entry for _, entry in pending])
            if not response.get("FailedEntryCount"):
                return []
            return [(pending[i], str(result["ErrorCode"]))
                    for i, result in enumerate(response.get("Entries", []))
                    if result.get("ErrorCode")]  # fmt: skip

        failed = retry_entries(put, list(batch), retryable=lambda _: True,
                               attempts=self._max_attempts, base_s=self._backoff,
                               sleep=self._sleep)  # fmt: skip
        return [(event_id, code) for (event_id, _), code in failed]


def _batches(
    entries: Sequence[tuple[str, dict[str, Any]]],
) -> Iterable[list[tuple[str, dict[str, Any]]]]:
    batch: list[tuple[str, dict[str, Any]]] = []
    size = 0
    for item in entries:
        item_size = entry_size(item[1])
        if batch and (len(batch) == MAX_ENTRIES_PER_CALL or size + item_size > MAX_ENTRY_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item_size
    if batch:
        yield batch
