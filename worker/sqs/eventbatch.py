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
from collections.abc import Callable
from typing import Final

from agentq.events import Event
from agentq.publisher import MAX_ENTRIES_PER_CALL, EventPublisher, PublishError
from worker.sqs.batchloop import BatchLoop, run_after

logger = logging.getLogger(__name__)
# Long enough for neighbouring tasks to share a call, short against any interval.
DEFAULT_DELAY_S: Final = 0.2
AfterSent = Callable[[], object]
Pending = tuple[Event, AfterSent | None, AfterSent | None]


class EventBatcher(BatchLoop[Pending]):
    def __init__(self, publisher: EventPublisher, *, delay_s: float = DEFAULT_DELAY_S) -> None:
        self._publisher = publisher
        super().__init__(name="event-batcher", delay_s=delay_s, max_batch=MAX_ENTRIES_PER_CALL)

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
            run_after(step, "after-publish step failed", eventId=event.event_id)
