"""Batches message deletes and visibility changes: ≤ 10 per call, flushed on size or
after a short delay, so a busy worker spends one request on many messages.

Callers enqueue and move on; `flush()` blocks until everything enqueued so far is sent
(used before exit). Entries a batch call rejects are logged; SQS redelivers such a
message and the STATE item decides what happens to it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from worker.batchloop import BatchLoop, run_after

MAX_BATCH: Final = 10
MAX_VISIBILITY_S: Final = 43_200
MAX_DELAY_S: Final = 900  # SendMessage DelaySeconds limit

Op = Literal["delete", "visibility"]
logger = logging.getLogger(__name__)


@dataclass
class _Item:
    op: Op
    receipt_handle: str
    visibility_s: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    then: Callable[[], object] | None = None

    def finish(self) -> None:
        self.done.set()
        run_after(self.then, "after-batch step failed")


def clamp_visibility(seconds: float) -> int:
    return max(0, min(MAX_VISIBILITY_S, int(seconds + 0.999)))


class SqsBatcher(BatchLoop[_Item]):
    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        *,
        delay_s: float = 0.2,
        on_error: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._on_error = on_error
        super().__init__(name="sqs-batcher", delay_s=delay_s, max_batch=MAX_BATCH)

    def delete(
        self, receipt_handle: str, *, then: Callable[[], object] | None = None
    ) -> threading.Event:
        """Queue a delete; `then` runs once its batch call returned (succeeded or not)."""
        return self._add(_Item("delete", receipt_handle, then=then))

    def change_visibility(self, receipt_handle: str, seconds: float) -> threading.Event:
        return self._add(_Item("visibility", receipt_handle, clamp_visibility(seconds)))

    def give_back(
        self,
        receipt_handle: str,
        message: Mapping[str, Any] | None,
        seconds: float = 0.0,
        *,
        fresh: bool = True,
    ) -> None:
        """Make a received message that ran no attempt available again after `seconds`.

        Fresh (the default when the message is known), it is requeued as a copy, so the
        receive it spent does not count toward the queue's maxReceiveCount: only real
        attempts may bring a task to the DLQ. Otherwise, or if the copy cannot be sent,
        its visibility is changed in place (one request instead of two, one receive spent).
        """
        if fresh and message is not None:
            try:
                self.requeue(message, seconds, receipt_handle=receipt_handle)
                return
            except Exception:
                logger.exception("requeue failed; giving the message back in place")
        self.change_visibility(receipt_handle, seconds)

    def requeue(
        self, message: Mapping[str, Any], seconds: float, *, receipt_handle: str | None = None
    ) -> threading.Event:
        """Send a copy of `message` that becomes visible after `seconds`, then delete it.

        The copy starts with a receive count of zero, so waiting does not spend the
        receives SQS allows before it dead-letters the message. Send first, delete after:
        a crash, a failed delete or a SendMessage retried after it was applied leaves a
        duplicate, which the lock settles like any other; the other order could lose
        the task. `receipt_handle` is the newest handle (default: the message's own).
        """
        attributes = {
            name: {
                k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")
            }
            for name, value in (message.get("MessageAttributes") or {}).items()
        }
        self._sqs.send_message(
            QueueUrl=self._queue_url,
            MessageBody=message.get("Body", ""),
            MessageAttributes=attributes,
            DelaySeconds=max(0, min(MAX_DELAY_S, int(seconds + 0.999))),
        )
        return self.delete(receipt_handle or message["ReceiptHandle"])

    def _add(self, item: _Item) -> threading.Event:
        self._submit([item])
        return item.done

    def _failed(self, batch: list[_Item]) -> None:
        logger.exception("sqs batch failed")
        for item in batch:
            if not item.done.is_set():
                item.finish()

    def _send(self, items: list[_Item]) -> None:
        for op in ("delete", "visibility"):
            group = [i for i in items if i.op == op]
            for start in range(0, len(group), MAX_BATCH):
                self._send_group(op, group[start : start + MAX_BATCH])

    def _send_group(self, op: str, group: list[_Item]) -> None:
        if not group:
            return
        try:
            if op == "delete":
                response = self._sqs.delete_message_batch(
                    QueueUrl=self._queue_url,
                    Entries=[{"Id": str(n), "ReceiptHandle": i.receipt_handle}
                             for n, i in enumerate(group)],
                )  # fmt: skip
            else:
                response = self._sqs.change_message_visibility_batch(
                    QueueUrl=self._queue_url,
                    Entries=[{"Id": str(n), "ReceiptHandle": i.receipt_handle,
                              "VisibilityTimeout": i.visibility_s}
                             for n, i in enumerate(group)],
                )  # fmt: skip
            for failure in response.get("Failed", []):
                item = group[int(failure["Id"])]
                item.error = str(failure.get("Code", "Unknown"))
                logger.warning(
                    "sqs batch entry failed",
                    extra={"op": op, "code": item.error, "detail": failure.get("Message")},
                )
                if self._on_error is not None:
                    with contextlib.suppress(Exception):
                        self._on_error(op, item.receipt_handle, item.error)
        finally:
            for item in group:
                item.finish()
