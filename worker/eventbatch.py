"""Publishes the worker's task events in shared `PutEvents` calls.

Slots hand events over and move on; a flusher sends up to 10 per call after a short
delay, so tasks that start and finish together share requests. Order is kept (one
FIFO), so a task's `Task Processing Started` always precedes its terminal event. The
STATE item, written synchronously before, stays the source of truth.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from agentq.events import Event
from agentq.publisher import MAX_ENTRIES_PER_CALL, EventPublisher

logger = logging.getLogger(__name__)
# Long enough for neighbouring tasks to share a call, short against any interval.
DEFAULT_DELAY_S: Final = 0.2


class EventBatcher:
    def __init__(self, publisher: EventPublisher, *, delay_s: float = DEFAULT_DELAY_S) -> None:
        self._publisher = publisher
        self._delay = delay_s
        self._pending: list[Event] = []
        self._in_progress = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="event-batcher", daemon=True)
        self._thread.start()

    def publish(self, event: Event) -> None:
        self.publish_many([event])

    def publish_many(self, events: list[Event]) -> None:
        with self._cond:
            if not self._closed:
                self._pending.extend(events)
                self._cond.notify_all()
                return
        self._send(events)

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

    def _send(self, batch: list[Event]) -> None:
        try:
            self._publisher.publish_all(batch, raise_on_failure=False)
        except Exception:
            # A lost event must not undo finished work; the STATE item holds the truth.
            logger.exception("events not published", extra={"events": len(batch)})
