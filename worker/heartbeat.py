"""One heartbeat loop for every message a worker holds.

Per interval: one `ChangeMessageVisibilityBatch` per 10 held messages, one conditional
lease renewal per running task, and one `PutEvents` for all `Task Heartbeat` events.
A renewal that finds another lease token means a newer attempt owns the task: that
child is stopped. After three consecutive failed extensions a message is no longer
extended (it becomes visible again and the STATE item arbitrates).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from agentq.config import Settings
from agentq.errors import LeaseLost
from agentq.events import Event, task_event
from agentq.publisher import EventPublisher
from agentq.store.tasks import TaskStore
from worker.batcher import MAX_BATCH
from worker.inflight import InFlight, InFlightRegistry

MAX_EXTENSION_FAILURES: Final = 3
logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        settings: Settings,
        sqs: Any,
        store: TaskStore,
        publisher: EventPublisher,
        inflight: InFlightRegistry,
        worker_id: str,
    ) -> None:
        self._settings = settings
        self._sqs = sqs
        self._queue_url = settings.required("queue_url")
        self._store = store
        self._publisher = publisher
        self._inflight = inflight
        self._worker_id = worker_id
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self.beats = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        interval = self._settings.extension_interval_ms / 1000
        while not self._stopped.wait(interval):
            try:
                self.beat()
            except Exception:
                logger.exception("heartbeat failed; trying again next interval")

    def beat(self) -> None:
        entries = [e for e in self._inflight.snapshot() if not e.stop.is_set()]
        if not entries:
            return
        self.beats += 1
        self._extend([e for e in entries if e.extending])
        events: list[Event] = []
        for entry in entries:
            event = self._renew(entry)
            if event is not None:
                events.append(event)
        if events:
            self._publisher.publish_all(events, raise_on_failure=False)

    def _extend(self, entries: list[InFlight]) -> None:
        amount = self._settings.extension_amount_s
        for start in range(0, len(entries), MAX_BATCH):
            chunk = entries[start : start + MAX_BATCH]
            try:
                response = self._sqs.change_message_visibility_batch(
                    QueueUrl=self._queue_url,
                    Entries=[{"Id": str(n), "ReceiptHandle": e.receipt_handle,
                              "VisibilityTimeout": amount} for n, e in enumerate(chunk)],
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

    def _renew(self, entry: InFlight) -> Event | None:
        lease = entry.lease
        if lease is None or entry.envelope is None:
            return None
        try:
            renewed = self._store.renew(lease, lease_seconds=self._settings.lease_seconds)
        except LeaseLost:
            logger.warning("lease lost; stopping the task", extra={"requestId": lease.request_id})
            entry.stop.set("lease_lost")
            return None
        except Exception:
            logger.exception("lease renewal failed", extra={"requestId": lease.request_id})
            return None
        entry.lease = renewed
        return task_event(
            "Task Heartbeat",
            request_id=lease.request_id,
            tenant=lease.tenant,
            job_id=entry.envelope.job_id,
            attempt=lease.attempt,
            worker_id=self._worker_id,
            definition=entry.envelope.definition,
            effective_until_ms=renewed.effective_until_ms,
        )
