"""Batches message deletes, visibility changes and requeued copies: ≤ 10 per call,
flushed on size or after a short delay, so a busy worker spends one request on many
messages.

Callers enqueue and move on; `flush()` blocks until everything enqueued so far is sent
(used before exit). An entry failed on SQS's side is sent again (twice at most); one
still failing is logged, SQS redelivers its message and the STATE item decides.

A requeue (a fresh copy of a received message, then the delete of the original) sends
its copy with `SendMessageBatch` and deletes the originals in the same flush, after
their copies are sent: under a limited tenant's flood the worker sends hundreds of its
messages back, and one request carried each copy. A copy SQS rejects, or a batch that
fails past botocore's retries, gives its original back in place instead (one receive
spent); a batch applied but answered with an error is sent again by botocore, and the
duplicate copies are settled by the task's lock like any other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agentq.backoff import retry_entries
from agentq.envelope import TENANT_PATTERN
from worker.inflight import MAX_VISIBILITY_S
from worker.routes import QueueRoutes
from worker.sqs.batchloop import BatchLoop, run_after
from worker.sqs.copies import copied_from, marked_copy, send_attributes

MAX_BATCH: Final = 10
ENTRY_ATTEMPTS: Final = 3  # sends of an entry SQS keeps failing on its side
ENTRY_BACKOFF_S: Final = 0.025  # pauses below 0.05 s, then 0.1 s
MAX_DELAY_S: Final = 900  # SendMessage DelaySeconds limit

Op = Literal["send", "delete", "visibility"]
# SendMessageBatch takes at most this much in all (bodies and attributes): 256 KiB, the
# limit before SQS raised it, so a queue of either age takes the batch.
MAX_BATCH_BYTES: Final = 262_144
logger = logging.getLogger(__name__)


@dataclass
class _Item:
    op: Op
    receipt_handle: str
    queue_url: str
    visibility_s: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    then: Callable[[], object] | None = None
    copy: dict[str, Any] | None = None  # a "send": the SendMessageBatch entry, less its Id
    message_id: str | None = None  # a "send": the message it copies, for the log

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
    ) -> None:
        self._sqs = sqs
        # Priority tiers: each message is settled on the queue it was received from.
        self.routes = QueueRoutes(queue_url)
        super().__init__(name="sqs-batcher", delay_s=delay_s, max_batch=MAX_BATCH)

    def delete(
        self, receipt_handle: str, *, then: Callable[[], object] | None = None
    ) -> threading.Event:
        """Queue a delete; `then` runs once its batch call returned (succeeded or not)."""
        return self._add(_Item("delete", receipt_handle, self.routes.queue_of(receipt_handle),
                               then=then))  # fmt: skip

    def change_visibility(self, receipt_handle: str, seconds: float) -> threading.Event:
        queue_url = self.routes.queue_of(receipt_handle)
        return self._add(_Item("visibility", receipt_handle, queue_url, clamp_visibility(seconds)))

    def forward(self, message: Mapping[str, Any], queue_url: str) -> threading.Event:
        """Move `message` to another queue (its priority tier's): send a copy, delete it."""
        self._sqs.send_message(QueueUrl=queue_url, MessageBody=message.get("Body", ""),
                               MessageAttributes=send_attributes(message),
                               **_group(message))  # fmt: skip
        return self.delete(message["ReceiptHandle"])

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
            self.requeue(message, seconds, receipt_handle=receipt_handle)
            return
        self.change_visibility(receipt_handle, seconds)

    def requeue(
        self,
        message: Mapping[str, Any],
        seconds: float,
        *,
        receipt_handle: str | None = None,
        at_once: bool = False,
    ) -> threading.Event:
        """Send a copy of `message` that becomes visible after `seconds`, then delete it
        (batched; the event is set once both are done, or the message was given back in
        place because its copy could not be sent).

        The copy starts with a receive count of zero, so waiting does not spend the
        receives SQS allows before it dead-letters the message. Send first, delete after:
        a crash, a failed delete or a send retried after it was applied leaves a
        duplicate, which the lock settles like any other; the other order could lose
        the task. `receipt_handle` is the newest handle (default: the message's own).
        `at_once`: its batch goes without the window for companions (another worker may
        be waiting for it now).
        """
        body, attributes = marked_copy(message)
        copy = {
            "MessageBody": body,
            "MessageAttributes": attributes,
            **_group(message),
            "DelaySeconds": max(0, min(MAX_DELAY_S, int(seconds + 0.999))),
        }
        done = self._add(_Item("send", receipt_handle or message["ReceiptHandle"],
                               self.routes.queue_of(message["ReceiptHandle"]),
                               clamp_visibility(seconds), copy=copy,
                               message_id=message.get("MessageId")))  # fmt: skip
        if at_once:
            self.hurry()
        return done

    def _add(self, item: _Item) -> threading.Event:
        self._submit([item])
        return item.done

    def _failed(self, batch: list[_Item]) -> None:
        logger.exception("sqs batch failed")
        for item in batch:
            if not item.done.is_set():
                item.finish()

    def _send(self, items: list[_Item]) -> None:
        # Copies first: each original is then deleted (or given back) in this same flush.
        items = [i for i in items if i.op != "send"] + self._send_copies(
            [i for i in items if i.op == "send"]
        )
        for op in ("delete", "visibility"):
            for queue_url in dict.fromkeys(i.queue_url for i in items):
                group = [i for i in items if i.op == op and i.queue_url == queue_url]
                for start in range(0, len(group), MAX_BATCH):
                    self._send_group(op, queue_url, group[start : start + MAX_BATCH])

    def _send_group(self, op: str, queue_url: str, group: list[_Item]) -> None:
        if not group:
            return
        try:
            failed = retry_entries(lambda pending: self._call(op, queue_url, pending), group,
                                   retryable=lambda failure: failure.get("SenderFault") is False,
                                   attempts=ENTRY_ATTEMPTS, base_s=ENTRY_BACKOFF_S)  # fmt: skip
            for item, failure in failed:
                item.error = str(failure.get("Code", "Unknown"))
                logger.warning("sqs batch entry failed", extra={
                    "op": op, "code": item.error, "detail": failure.get("Message")})  # fmt: skip
        finally:
            for item in group:
                if op == "delete":
                    self.routes.forget(item.receipt_handle)
                item.finish()

    def _call(
        self, op: str, queue_url: str, group: list[_Item]
    ) -> list[tuple[_Item, Mapping[str, Any]]]:
        """One batch call for `group`; the entries it failed, with SQS's answer for each."""
        if op == "delete":
            response = self._sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": i.receipt_handle}
                         for n, i in enumerate(group)],
            )  # fmt: skip
        else:
            response = self._sqs.change_message_visibility_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": i.receipt_handle,
                          "VisibilityTimeout": i.visibility_s}
                         for n, i in enumerate(group)],
            )  # fmt: skip
        return [(group[int(failure["Id"])], failure) for failure in response.get("Failed", [])]

    def _send_copies(self, sends: list[_Item]) -> list[_Item]:
        """Send the requeued copies; what follows for each original: its delete, or its
        give-back in place when its copy was not sent."""
        following: list[_Item] = []
        for queue_url in dict.fromkeys(i.queue_url for i in sends):
            for group in _chunks([i for i in sends if i.queue_url == queue_url]):
                failed = self._send_copy_group(queue_url, group)
                for n, item in enumerate(group):
                    follow = (_Item("visibility", item.receipt_handle, queue_url, item.visibility_s)
                              if n in failed else _Item("delete", item.receipt_handle, queue_url))  # fmt: skip
                    follow.then = item.finish
                    following.append(follow)
        return following

    def _send_copy_group(self, queue_url: str, group: list[_Item]) -> set[int]:
        """One SendMessageBatch; the positions in `group` whose copy was not sent."""
        try:
            response = self._sqs.send_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(n), **(i.copy or {})} for n, i in enumerate(group)],
            )
        except Exception:
            logger.exception("requeue failed; giving the message back in place",
                             extra={"messageIds": [i.message_id for i in group]})  # fmt: skip
            return set(range(len(group)))
        failed = {int(f["Id"]) for f in response.get("Failed", [])}
        for failure in response.get("Failed", []):
            logger.warning("requeue failed; giving the message back in place",
                           extra={"messageId": group[int(failure["Id"])].message_id,
                                  "code": failure.get("Code"),
                                  "detail": failure.get("Message")})  # fmt: skip
        return failed


def _chunks(sends: list[_Item]) -> list[list[_Item]]:
    """`sends` in SendMessageBatch-sized groups: ≤ 10 entries, ≤ MAX_BATCH_BYTES in all
    (a copy larger than that alone, as SQS took the original)."""
    groups: list[list[_Item]] = []
    size = 0
    for item in sends:
        item_size = _copy_size(item.copy or {})
        if groups and len(groups[-1]) < MAX_BATCH and size + item_size <= MAX_BATCH_BYTES:
            groups[-1].append(item)
            size += item_size
        else:
            groups.append([item])
            size = item_size
    return groups


def _copy_size(copy: Mapping[str, Any]) -> int:
    """What SQS counts toward a batch's size: the body, and each attribute's name, type
    and value."""
    size = len(str(copy.get("MessageBody", "")).encode())
    for name, value in (copy.get("MessageAttributes") or {}).items():
        size += len(name.encode()) + len(str(value.get("DataType", "")).encode())
        data = value.get("StringValue", value.get("BinaryValue", b""))
        size += len(data.encode() if isinstance(data, str) else data)
    return size


def is_copy(message: Mapping[str, Any]) -> bool:
    """A requeued copy of an earlier message (it names that message, worker.sqs.copies)."""
    return copied_from(message) is not None


def _group(message: Mapping[str, Any]) -> dict[str, str]:
    """A copy keeps its tenant's `MessageGroupId` (SQS fair queues), else none."""
    group = (message.get("Attributes") or {}).get("MessageGroupId")
    if isinstance(group, str) and TENANT_PATTERN.fullmatch(group):
        return {"MessageGroupId": group}
    return {}


MAX_LOGGED_ATTRIBUTE: Final = 128


def message_log(message: Mapping[str, Any]) -> dict[str, Any]:
    """A received message's identity for a log line."""
    attributes = message.get("MessageAttributes") or {}

    def attribute(name: str) -> str | None:
        # A foreign sender's attributes are untrusted: a bounded excerpt goes to the log.
        value = attributes.get(name)
        text = value.get("StringValue") if isinstance(value, Mapping) else None
        return text[:MAX_LOGGED_ATTRIBUTE] if isinstance(text, str) else None

    def _bounded(text: str | None) -> str | None:
        return text[:MAX_LOGGED_ATTRIBUTE] if text is not None else None

    return {
        "messageId": message.get("MessageId"),
        "requestId": attribute("requestId"),
        "receiveCount": (message.get("Attributes") or {}).get("ApproximateReceiveCount"),
        "requeuedFrom": _bounded(copied_from(message)),
    }
