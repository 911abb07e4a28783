"""SQS: a message's visibility ends at most 12 hours after the receive that returned it.

AWS (ChangeMessageVisibility): the visibility timeout of a message can be extended to a
maximum of 12 hours from the time the receive request was received; a request that
would extend it beyond that is rejected, and SQS does not recalculate it to the time
left. The rejection is `InvalidParameterValue` ("Value N for parameter
VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond
the limit [43200 seconds]"); in ChangeMessageVisibilityBatch each entry is judged on
its own: a rejected one is listed under `Failed`, the others apply.

moto 5.2 counts the 12 hours from the message's *send* (so a message that waited in the
queue before its receive is refused extensions AWS grants), and in a batch the
rejection of one entry fails the whole call. This rule counts from the latest receive
and fails only the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from agentq.local.moto_guards import parameters, refuse, source_of

MAX_VISIBILITY_S: Final = 43_200
# Where the rule keeps, on moto's message, the time (ms, moto's SQS clock) of its
# latest receive.
RECEIVED_MS: Final = "_agentq_received_ms"
PATCHER: Final = "agentq/local/rules/sqs_visibility_cap.py"


def beyond_limit(visibility_timeout: int) -> str:
    return (f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
            f"Reason: Total VisibilityTimeout for the message is beyond the limit "
            f"[{MAX_VISIBILITY_S} seconds]")  # fmt: skip


def _checked() -> tuple[Any, Any, Any, type[Exception], type[Exception]]:
    """moto.sqs.models, its Message and SQSBackend, and the two errors, as this rule
    was written for them."""
    from moto.sqs import models

    message, backend = getattr(models, "Message", None), getattr(models, "SQSBackend", None)
    invalid = getattr(models, "InvalidParameterValue", None)
    bad_handle = getattr(models, "ReceiptHandleIsInvalid", None)
    if not (isinstance(message, type) and isinstance(backend, type)
            and isinstance(invalid, type) and issubclass(invalid, Exception)
            and isinstance(bad_handle, type) and issubclass(bad_handle, Exception)):  # fmt: skip
        raise refuse("moto", "moto.sqs.models lost Message, SQSBackend or its errors", PATCHER)
    change = getattr(backend, "change_message_visibility", None)
    batch = getattr(backend, "change_message_visibility_batch", None)
    received = getattr(message, "mark_received", None)
    if change is None or batch is None or received is None:
        raise refuse("moto", "SQS visibility methods are gone", PATCHER)
    if not hasattr(change, "agentq_rule"):
        if parameters(change) != ["self", "queue_name", "receipt_handle", "visibility_timeout"]:
            raise refuse("moto", "change_message_visibility(...) changed", PATCHER)
        source = source_of(change)
        for needed in ("had_receipt_handle(receipt_handle)", "message.change_visibility(",
                       "queue.pending_messages.remove(message)", "raise ReceiptHandleIsInvalid"):  # fmt: skip
            if needed not in source:
                raise refuse("moto", f"change_message_visibility no longer does {needed}", PATCHER)
        if parameters(batch) != ["self", "queue_name", "entries"]:
            raise refuse("moto", "change_message_visibility_batch(...) changed", PATCHER)
        if parameters(received) != ["self", "visibility_timeout"]:
            raise refuse("moto", "Message.mark_received(...) changed", PATCHER)
        if not callable(getattr(models, "unix_time_millis", None)):
            raise refuse("moto", "moto.sqs.models no longer reads unix_time_millis", PATCHER)
    return models, message, backend, invalid, bad_handle


def install() -> None:
    """Count each message's 12 hours from its latest receive; reject per entry. Idempotent."""
    models, message_type, backend, invalid, bad_handle = _checked()
    if hasattr(backend.change_message_visibility, "agentq_rule"):
        return
    mark_received: Callable[..., None] = message_type.mark_received
    batch: Callable[..., tuple[list[str], list[dict[str, str]]]] = (
        backend.change_message_visibility_batch
    )

    def received(self: Any, visibility_timeout: int | None = None) -> None:
        setattr(self, RECEIVED_MS, int(models.unix_time_millis()))
        mark_received(self, visibility_timeout)

    def change_message_visibility(
        self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        # moto's own, with the 12 hours counted from the receive instead of the send.
        queue = self.get_queue(queue_name)
        for message in queue._messages:
            if not message.had_receipt_handle(receipt_handle):
                continue
            ends_ms = models.unix_time_millis() + int(visibility_timeout) * 1000
            received_ms = getattr(message, RECEIVED_MS, None)
            if received_ms is not None and ends_ms > received_ms + MAX_VISIBILITY_S * 1000:
                raise invalid(beyond_limit(visibility_timeout))
            message.change_visibility(visibility_timeout)
            if message.visible and message in queue.pending_messages:
                queue.pending_messages.remove(message)
            return
        raise bad_handle()

    def change_message_visibility_batch(
        self: Any, queue_name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[dict[str, str]]]:
        # One entry at a time through moto's batch (its checks and its answers), so a
        # rejected entry fails alone, as on AWS.
        succeeded: list[str] = []
        failed: list[dict[str, str]] = []
        for entry in entries:
            try:
                ok, errors = batch(self, queue_name, [entry])
            except invalid as exc:
                failed.append({"Id": entry["Id"], "SenderFault": True,  # type: ignore[dict-item]
                               "Code": "InvalidParameterValue",
                               "Message": str(getattr(exc, "message", exc))})  # fmt: skip
                continue
            succeeded.extend(ok)
            failed.extend(errors)
        return succeeded, failed

    for function in (change_message_visibility, change_message_visibility_batch, received):
        setattr(function, "agentq_rule", True)  # noqa: B010 (a mark on a function)
    message_type.mark_received = received
    backend.change_message_visibility = change_message_visibility
    backend.change_message_visibility_batch = change_message_visibility_batch
