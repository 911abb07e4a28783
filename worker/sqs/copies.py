"""The mark of a requeued copy: which message it replaces (`requeuedFrom`).

A copy is passed on at most once (worker.receive.consumer), so the mark must survive every
message, including one whose sender used all 10 message attributes SQS allows. Then
the copy gives up agentq's `taskType` attribute (the body's `definition` says the same,
and it is what the worker reads); a message without one carries the mark in its JSON
body instead, as a top-level `requeuedFrom` that the envelope's reader ignores.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from agentq.envelope import MAX_BODY_BYTES
from agentq.errors import InvalidInput
from agentq.json_text import decode_json, decode_or_none

MAX_ATTRIBUTES: Final = 10  # message attributes SendMessage takes
# A requeued copy names the message it replaces (its MessageId) in this attribute: the
# lineage of a task's messages, which the worker logs at each receive.
REQUEUED_FROM: Final = "requeuedFrom"
# agentq's own attribute a full copy gives up for the mark: the body carries the same.
DROPPABLE: Final = "taskType"
logger = logging.getLogger(__name__)


def send_attributes(message: Mapping[str, Any]) -> dict[str, Any]:
    """A received message's attributes in the shape SendMessage takes."""
    return {
        name: {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, value in (message.get("MessageAttributes") or {}).items()
        if isinstance(value, Mapping)
    }


def marked_copy(message: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The body and attributes of a copy of `message` that names it as its original."""
    body = str(message.get("Body", ""))
    attributes = send_attributes(message)
    original = message.get("MessageId")
    if not original:
        return body, attributes
    mark = {"DataType": "String", "StringValue": str(original)}
    if REQUEUED_FROM in attributes or len(attributes) < MAX_ATTRIBUTES:
        attributes[REQUEUED_FROM] = mark
        return body, attributes
    if DROPPABLE in attributes:
        del attributes[DROPPABLE]
        attributes[REQUEUED_FROM] = mark
        return body, attributes
    marked = _marked_body(body, str(original))
    if marked is None:
        logger.warning("a copy could not be marked (10 attributes, body not a JSON object)",
                       extra={"messageId": original})  # fmt: skip
        return body, attributes
    return marked, attributes


def copied_from(message: Mapping[str, Any]) -> str | None:
    """The message a copy replaces, if `message` is a marked copy."""
    attributes = message.get("MessageAttributes") or {}
    value = attributes.get(REQUEUED_FROM)
    if isinstance(value, Mapping):
        text = value.get("StringValue")
        return text if isinstance(text, str) else None
    if len(attributes) < MAX_ATTRIBUTES:
        return None  # a body mark is made only when the attributes are full
    data = decode_or_none(str(message.get("Body", "")))
    mark = data.get(REQUEUED_FROM) if isinstance(data, dict) else None
    return mark if isinstance(mark, str) else None


def _marked_body(body: str, original: str) -> str | None:
    """The body with the mark, or None when marking could change how it is judged: only
    a body the strict reader takes is rewritten (a NaN must not turn into a valid null),
    and only within the size the envelope allows."""
    try:
        data = decode_json(body)
        if not isinstance(data, dict):
            return None
        marked = json.dumps({**data, REQUEUED_FROM: original}, ensure_ascii=False,
                            separators=(",", ":"), allow_nan=False)  # fmt: skip
        size = len(marked.encode())
    except (InvalidInput, UnicodeEncodeError, ValueError):
        return None
    return marked if size <= MAX_BODY_BYTES else None
