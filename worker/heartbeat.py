"""One heartbeat loop for every message a worker holds.

Per interval: one `ChangeMessageVisibilityBatch` per 10 held messages, one
`TransactWriteItems` renewing every running task's lease (`TaskStore.renew_many`,
conditional on each lease token; a task of a limited tenant renews its seat with it), and one `PutEvents` for all `Task Heartbeat` events:
three requests for ten tasks. A renewal that finds another lease token means a newer
attempt owns the task: that child is stopped. After three consecutive failed extensions
a message is no longer extended (it becomes visible again and the STATE item arbitrates);
nor is a message past what SQS allows for its receive (12 hours from it, worker.inflight),
nor one a back-off settled (it keeps the visibility the back-off gave it).
A renewal refused because a cancel was requested stops that child (`cancelled`): the
flag is seen in the refused item the transaction returns, so noticing costs no read.

Every lease held is handed to its child's `StopSignal` (`hold`) before the beat's
requests and again once renewed: the supervisor mirrors it into the task dir and stops
a child whose lease is about to lapse unrenewed (worker/child/leasefile.py). A failed renewal
is tried again sooner than the next interval, so one lost request does not cost a task.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

from agentq.config import Settings
from agentq.events import Event, task_event
from agentq.store.tasks import Lease, TaskStore
from worker.child.leasefile import lease_times
from worker.inflight import InFlight, InFlightRegistry
from worker.liveness import touch
from worker.routes import QueueRoutes
from worker.sqs.batcher import MAX_BATCH
from worker.sqs.eventbatch import EventBatcher

HEARTBEAT_THREAD: Final = "heartbeat"  # the worker's stats count this thread's calls apart
MAX_EXTENSION_FAILURES: Final = 3
RENEWAL_RETRY_S: Final = 1.0  # at least this long between tries after a failed renewal
logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        settings: Settings,
        sqs: Any,
        store: TaskStore,
        publisher: EventBatcher,
        inflight: InFlightRegistry,
        worker_id: str,
        routes: QueueRoutes | None = None,
    ) -> None:
        self._settings = settings
        self._sqs = sqs
        # Each held message is extended on its own tier's queue.
        self._routes = routes or QueueRoutes(settings.required("queue_url"))
        self._store = store
        self._publisher = publisher
        self._inflight = inflight
        self._worker_id = worker_id
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=HEARTBEAT_THREAD, daemon=True)
        self.beats = 0
        self._renewal_failed = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        interval = self._settings.extension_interval_ms / 1000
        due = time.monotonic() + interval
        # Fixed rate, not fixed delay: a slow beat must not push the next one later.
        while not self._stopped.wait(max(0.0, due - time.monotonic())):
            due = max(due + interval, time.monotonic() + interval / 2)
            began = time.monotonic()
            try:
                self.beat()
            except Exception:
                logger.exception("heartbeat failed; trying again next interval")
            touch(self._settings.liveness_file)
            took = time.monotonic() - began
            if took > interval:
                logger.warning("heartbeat slower than its interval", extra={"seconds": took})
            if self._renewal_failed:
                # Waiting a whole interval after a failure can leave so little of the
                # lease that the worker's fence stops the task (worker/child/leasefile.py).
                due = min(due, time.monotonic() + max(RENEWAL_RETRY_S, interval / 4))

    def beat(self) -> None:
        self._renewal_failed = False
        entries = [e for e in self._inflight.snapshot() if not e.stop.is_set()]
        if not entries:
            return
        self.beats += 1
        # Leases first: on a slow backend a late renewal is what stops a task (the fence).
        events = self._renew([e for e in entries if e.lease is not None])
        self._extend([e for e in entries if e.extending])
        if events:
            # Into the shared batcher: heartbeats ride along with other task events.
            self._publisher.publish_many(events)

    def _extend(self, entries: list[InFlight]) -> None:
        by_queue: dict[str, list[InFlight]] = {}
        for entry in entries:
            by_queue.setdefault(self._routes.queue_of(entry.receipt_handle), []).append(entry)
        for queue_url, held in by_queue.items():
            self._extend_on(queue_url, held)

    def _extend_on(self, queue_url: str, entries: list[InFlight]) -> None:
        amount = self._settings.extension_amount_s
        # Read again after the renewals' round trip: a message a back-off settled since
        # keeps that back-off. None past what SQS allows for its receive (12 hours from
        # it): a rejected extension would let it lapse unnoticed. A message at that end
        # is left to lapse; the STATE item arbitrates its next receive.
        extensions: list[tuple[InFlight, int]] = []
        for entry in entries:
            seconds = int(entry.within_visibility_room(amount))
            if not entry.extending:
                continue
            if seconds >= 1:
                extensions.append((entry, seconds))
                continue
            entry.extending = False
            logger.warning("visibility extension ended: SQS's 12 hours for this receive",
                           extra={"requestId": entry.request_id,
                                  "messageId": entry.message_id})  # fmt: skip
        for start in range(0, len(extensions), MAX_BATCH):
            sent = extensions[start : start + MAX_BATCH]
            chunk = [entry for entry, _ in sent]
            try:
                response = self._sqs.change_message_visibility_batch(
                    QueueUrl=queue_url,
                    Entries=[{"Id": str(n), "ReceiptHandle": e.receipt_handle,
                              "VisibilityTimeout": seconds}
                             for n, (e, seconds) in enumerate(sent)],
                )  # fmt: skip
                failed = {int(f["Id"]) for f in response.get("Failed", [])}
            except Exception:
                logger.exception("visibility extension call failed")
                failed = set(range(len(chunk)))
            for index, entry in enumerate(chunk):
                if index not in failed:
                    entry.extension_failures = 0
                    continue
                entry.extension_failures += 1
                if entry.extension_failures >= MAX_EXTENSION_FAILURES:
                    entry.extending = False
                    logger.warning(
                        "visibility extension given up",
                        extra={"requestId": entry.request_id, "messageId": entry.message_id},
                    )

    def _renew(self, entries: list[InFlight]) -> list[Event]:
        # A slot thread clears `entry.lease` when its child ends, at any moment: each
        # lease is read once, here, and only that local is used from then on.
        held: dict[str, tuple[InFlight, Lease]] = {}
        for entry in entries:
            lease = entry.lease
            if lease is not None:
                held[lease.token] = (entry, lease)
        if not held:
            return []
        for entry, lease in held.values():
            # Before any request: a renewal that hangs must not keep the fence unset.
            entry.stop.hold(lease_times(lease.effective_until_ms, self._settings))
        try:
            renewals = self._store.renew_leases(
                [lease for _, lease in held.values()], lease_seconds=self._settings.lease_seconds
            )
        except Exception:
            logger.exception("lease renewal failed; trying again soon")
            self._renewal_failed = True
            return []
        renewed, lost = renewals.renewed, renewals.lost
        if len(renewed) + len(lost) + len(renewals.cancelled) < len(held):
            self._renewal_failed = True  # some leases were neither: try them again soon
        for lease in lost:
            entry = held[lease.token][0]
            if entry.lease is None or not self._inflight.holds(entry):
                continue  # its child ended meanwhile: finalize ends the lease, not us
            logger.warning("lease lost; stopping the task", extra={"requestId": lease.request_id})
            entry.stop.set("lease_lost")
        for lease in renewals.cancelled:
            entry = held[lease.token][0]
            if entry.lease is None or not self._inflight.holds(entry):
                continue  # its child ended meanwhile: its own ending stands
            logger.info("cancel requested; stopping the task",
                        extra={"requestId": lease.request_id})  # fmt: skip
            entry.stop.set("cancelled")
        events = []
        for lease in renewed:
            entry, read = held[lease.token]
            if entry.lease is not read:
                continue  # the child ended meanwhile; no heartbeat for a finished attempt
            entry.lease = lease
            entry.stop.hold(lease_times(lease.effective_until_ms, self._settings))
            envelope = entry.envelope
            events.append(
                task_event(
                    "Task Heartbeat",
                    request_id=lease.request_id,
                    tenant=lease.tenant,
                    job_id=envelope.job_id if envelope else None,
                    attempt=lease.attempt,
                    worker_id=self._worker_id,
                    definition=envelope.definition if envelope else None,
                    effective_until_ms=lease.effective_until_ms,
                )
            )
        return events
