"""The handler's task events: built with this worker's identity, handed to the event
batcher with what follows once they are sent (`then`, `otherwise`), and a finished
task's stored terminal event sent again when its message comes back.

The outbox rule the handler keeps everywhere: a message is deleted only once the event
that reports its end is out; a crash in between brings the message back, and the same
event (same id) goes out again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agentq.envelope import TaskEnvelope
from agentq.errors import InvalidInput
from agentq.events import DetailType, Event, task_event
from agentq.states import TaskState
from agentq.store.tasks import Lease, TaskStore
from worker.inflight import InFlight
from worker.sqs.batcher import SqsBatcher

logger = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where task events go (an `EventBatcher`); `then` runs once the event is sent,
    `otherwise` if it could not be."""

    def publish(
        self,
        event: Event,
        /,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None: ...


class Outbox:
    def __init__(
        self, *, publisher: EventSink, store: TaskStore, batcher: SqsBatcher, worker_id: str
    ) -> None:
        self._publisher = publisher
        self._store = store
        self._batcher = batcher
        self._worker_id = worker_id

    def emit(self, detail_type: DetailType, **fields: Any) -> None:
        """Build (see `event`) and publish a task event."""
        self.publish(self.event(detail_type, **fields))

    def event(
        self,
        detail_type: DetailType,
        *,
        envelope: TaskEnvelope | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        attempt: int = 0,
        effective_until_ms: int | None = None,
        **payload: Any,
    ) -> Event:
        if envelope is not None and envelope.priority:
            payload.setdefault("priority", envelope.priority)  # per-tier figures
        return task_event(
            detail_type,
            request_id=envelope.request_id if envelope else str(request_id),
            tenant=envelope.tenant if envelope else str(tenant),
            job_id=envelope.job_id if envelope else None,
            attempt=attempt,
            worker_id=self._worker_id,
            definition=envelope.definition if envelope else None,
            effective_until_ms=effective_until_ms,
            **payload,
        )

    def publish(
        self,
        event: Event,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None:
        try:
            self._publisher.publish(event, then=then, otherwise=otherwise)
        except Exception:
            # The STATE item already holds the truth; a lost event must not undo the work.
            logger.exception("event not published", extra={"detailType": event.detail_type})
            if otherwise is not None:
                otherwise()

    def finish(
        self,
        entry: InFlight,
        lease: Lease,
        state: TaskState,
        event: Event,
        *,
        fields: Mapping[str, Any],
        forget: Callable[[], object],
    ) -> None:
        """End the attempt in `state` with `event` stored on the STATE item (its one
        final write, fenced by the lease token), then publish it and delete the message
        once it is out. `forget` runs once the delete was sent, or the event was not.
        A crash in between brings the message back as a duplicate, which sends the
        same event (same id) again."""
        self._store.end_attempt(lease, state, fields={**fields,
                                                      "terminalEvent": event.to_detail()})  # fmt: skip
        # The heartbeat keeps the message invisible until the delete is sent (the event
        # and delete batches may take longer than one visibility extension).
        entry.awaiting_delete = True
        self.publish(
            event,
            then=lambda: self._batcher.delete(entry.receipt_handle, then=forget),
            otherwise=forget,
        )

    def cancel_instead(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        lease: Lease,
        *,
        forget: Callable[[], object],
        fields: Mapping[str, Any] | None = None,
        duration_ms: int | None = None,
    ) -> None:
        """The attempt was to end retryable or be given back, but a cancel was
        requested meanwhile (`CancelRequested`): it ends CANCELLED and its message goes,
        so the caller told "cancel requested" never sees another attempt."""
        timing: dict[str, Any] = {} if duration_ms is None else {"duration_ms": duration_ms}
        event = self.event("Task Cancelled", envelope=envelope, attempt=lease.attempt,
                           reason="cancel requested", task_key=envelope.task_key,
                           **timing)  # fmt: skip
        self.finish(entry, lease, TaskState.CANCELLED, event, fields=fields or {}, forget=forget)

    def resend_terminal_event_then_delete(self, entry: InFlight, envelope: TaskEnvelope) -> None:
        """A finished task's message came back: make sure its terminal event went out.

        The event stored on the STATE item keeps its id and time, so save-event and the
        dispatcher see a duplicate, not a second ending.
        """
        record = self._store.get(envelope.tenant, envelope.request_id)
        stored = record.raw.get("terminalEvent") if record is not None else None
        delete = functools.partial(self._batcher.delete, entry.receipt_handle)
        if not isinstance(stored, Mapping):
            delete()
            return
        try:
            event = Event.from_detail(stored)
        except InvalidInput:
            logger.warning(
                "unreadable stored terminal event", extra={"requestId": envelope.request_id}
            )
            delete()
            return
        self.publish(event, then=delete)
