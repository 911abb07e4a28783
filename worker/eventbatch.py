"""Publishes the worker's task events in shared `PutEvents` calls.

Slots hand events over and move on; a flusher sends up to 10 per call after a short
delay, so tasks that start and finish together share requests. Order is kept (one
FIFO), so a task's `Task Processing Started` always precedes its terminal event. The
STATE item, written synchronously before, stays the source of truth.

`publish(event, then=..., otherwise=...)` runs `then` only once the event is on the
bus, `otherwise` if sending it failed: the worker deletes a finished task's message that
way, so a crash between the two leaves the message to come back and the terminal event
to be sent again (see handler).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from agentq.events import Event
from agentq.publisher import MAX_ENTRIES_PER_CALL, EventPublisher, PublishError

logger = logging.getLogger(__name__)
# Long enough for neighbouring tasks to share a call, short against any interval.
DEFAULT_DELAY_S: Final = 0.2
AfterSent = Callable[[], object]
Pending = tuple[Event, AfterSent | None, AfterSent | None]


class EventBatcher:
    def __init__(self, publisher: EventPublisher, *, delay_s: float = DEFAULT_DELAY_S) -> None:
        self._publisher = publisher
        self._delay = delay_s
        self._pending: list[Pending] = []
        self._in_progress = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="event-batcher", daemon=True)
        self._thread.start()

    def publish(
        self,
        event: Event,
        /,
        *,
        then: AfterSent | None = None,
        otherwise: AfterSent | None = None,
    ) -> None:
        self._submit([(event, then, otherwise)])

    def publish_many(self, events: list[Event]) -> None:
        self._submit([(event, None, None) for event in events])

    def _submit(self, items: list[Pending]) -> None:
        with self._cond:
            if not self._closed:
                self._pending.extend(items)
                self._cond.notify_all()
                return
        self._send(items)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything handed over so far is sent; False on timeout."""
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: not self._pending and not self._in_progress, timeout=timeout_s
            )

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                first = time.monotonic()
                while len(self._pending) < MAX_ENTRIES_PER_CALL and not self._closed:
                    left = self._delay - (time.monotonic() - first)
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._pending[:MAX_ENTRIES_PER_CALL]
                self._pending = self._pending[MAX_ENTRIES_PER_CALL:]
                self._in_progress += 1
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._in_progress -= 1
                    self._cond.notify_all()

    def _send(self, batch: list[Pending]) -> None:
        failed: set[str] = set()
        try:
            self._publisher.publish_all([event for event, _, _ in batch])
        except PublishError as exc:
            failed = {event_id for event_id, _ in exc.failed}
            logger.error("events not published", extra={"failed": exc.failed})
        except Exception:
            # A lost event must not undo finished work; the STATE item holds the truth.
            failed = {event.event_id for event, _, _ in batch}
            logger.exception("events not published", extra={"events": len(batch)})
        for event, then, otherwise in batch:
            step = otherwise if event.event_id in failed else then
            if step is None:
                continue
            try:
                step()
            except Exception:
                logger.exception("after-publish step failed", extra={"eventId": event.event_id})
