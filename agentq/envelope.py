"""The task envelope: agentq's wire format on the task queue.

A message body is a JSON object::

    {"version": 1, "requestId": "r-123", "tenant": "acme", "definition": "summarize",
     "input": {...}, "jobId": null, "taskKey": null, "submittedAt": 1732579200000,
     "notBefore": 1732579500000}

`notBefore` (optional) delays the task: it is not run before that time (epoch ms, or
any form agentq.schedule accepts). A foreign sender or a `Task Requested` event may give
`delay` (seconds) instead, counted from `submittedAt` (for an event: its `time`); a
`delay` with neither is refused, since each receive would push it further out.

with the message attribute `requestId` (String, ``^[a-zA-Z0-9_-]{1,256}$``) and, for
routing and metrics, `tenant`, `taskType`, `jobId` and `priority` (also in the body
when the producer chose one; docs/scheduling.md). A `Task Requested` event routed
from EventBridge arrives as the EventBridge envelope (no attributes); its `detail` holds
the same fields and is unwrapped here.

A message names a registered task definition, never code or an import path.
"""

from __future__ import annotations

import contextlib
import decimal
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.errors import InvalidInput, InvalidRequestId, shown
from agentq.json_text import MAX_NESTING, decode_json, decode_or_none
from agentq.schedule import MAX_EPOCH_MS, parse_time_ms, resolve_not_before

REQUEST_ID_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_-]{1,256}$")
DEFINITION_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
TENANT_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
# A priority tier's name (which names exist is configuration: PRIORITIES).
PRIORITY_PATTERN: Final = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
MAX_BODY_BYTES: Final = 256 * 1024
ENVELOPE_VERSION: Final = 1
MAX_TASK_KEY: Final = 256
# A follow-up prompt: the same bound as one prompt input value (agentq.security).
MAX_FOLLOW_UP: Final = 100_000
# The envelope object itself, once unwrapped: one level sits above it in the STATE item.
MAX_ENVELOPE_DEPTH: Final = MAX_NESTING - 1
# What a DynamoDB number can hold (38 digits, magnitude 1e-130 to below 1e126): a
# number outside it fails every write of the envelope, so it is refused where it comes in.
_DYNAMO_NUMBERS: Final = decimal.Context(
    prec=38, Emin=-130, Emax=125,
    traps=[decimal.Clamped, decimal.Overflow, decimal.Inexact, decimal.Rounded,
           decimal.Underflow, decimal.Subnormal],
)  # fmt: skip
# A lone surrogate decodes from JSON (``"\ud800"``) but cannot be encoded as UTF-8, so
# every AWS call that carries it fails after the fact (the lock, the event, the archive).
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# A map key is an attribute name to DynamoDB, at any depth: one that is empty or 64 KiB
# long is refused by every write ("Empty attribute name"), and moto stores it mangled.
_MAX_KEY_BYTES: Final = 65_536


def validate_request_id(value: object) -> str:
    if not isinstance(value, str) or not REQUEST_ID_PATTERN.fullmatch(value):
        raise InvalidRequestId(value)
    return value


def _validate(pattern: re.Pattern[str], name: str, value: object) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(name, f"must match {pattern.pattern}, got {shown(value)}")
    return value


class DecodedBody(str):
    """A message body that was already decoded (`decode_json`), with its value.

    Still the body's text everywhere (a copy sent on, an archived dead letter); the
    worker's tier routing decodes a body to read its priority and hands it on in this
    form, so `parse_message` does not decode the same untrusted text a second time."""

    data: Any

    def __new__(cls, text: str, data: Any) -> DecodedBody:
        body = super().__new__(cls, text)
        body.data = data
        return body


def check_storable(value: object, *, name: str, depth: int = 1) -> None:
    """Refuse a decoded value that agentq could not store or send: too deep, a lone
    surrogate in a key or string, an empty or oversized key, a non-finite or
    out-of-range number, a non-JSON type.

    `depth` is the level `value` sits at in the STATE item's envelope (1: the envelope).
    """
    stack: list[tuple[object, str, int]] = [(value, name, depth)]
    while stack:
        item, path, level = stack.pop()
        if level > MAX_ENVELOPE_DEPTH:
            raise InvalidInput(path, f"nested deeper than {MAX_ENVELOPE_DEPTH} levels")
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise InvalidInput(path, "holds a lone surrogate (not valid Unicode text)")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            _check_number(item, path)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str) or _SURROGATE.search(key):
                    raise InvalidInput(path, f"has a key that is not valid text: {key!a:.60}")
                _check_key(key, path)
                stack.append((child, f"{path}.{key[:40]}", level + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]", level + 1) for i, child in enumerate(item))
        else:
            raise InvalidInput(path, f"is a {type(item).__name__}, not a JSON value")


def _check_key(key: str, path: str) -> None:
    if not key:
        raise InvalidInput(path, "has an empty key, which DynamoDB cannot store")
    size = len(key.encode())
    if size >= _MAX_KEY_BYTES:
        raise InvalidInput(path, f"has a key of {size} bytes; keys must be under 64 KiB")


def _check_number(value: int | float, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(path, f"is {value}, which JSON does not allow")
    try:
        _DYNAMO_NUMBERS.create_decimal(repr(value) if isinstance(value, float) else value)
    except decimal.DecimalException:
        size = f"{value:.3g}" if isinstance(value, float) else f"{value.bit_length()} bits"
        raise InvalidInput(
            path, f"number ({size}) is outside what agentq stores: 38 digits, 1e-130..1e125"
        ) from None


@dataclass(frozen=True, kw_only=True)
class TaskEnvelope:
    request_id: str
    tenant: str
    definition: str
    input: Mapping[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    task_key: str | None = None
    submitted_at_ms: int | None = None
    not_before_ms: int | None = None
    priority: str | None = None  # None: the tier of the queue it arrived on
    # A continuation (body fields `continues`, `prompt`): the task of the same tenant whose
    # final agent session this one starts from, and the follow-up, its next user turn.
    continues: str | None = None
    prompt: str | None = None
    # Resume on retry for this task alone (body field `resume`), over its agent
    # definition's `resume`; None: the definition decides (agentq.resume).
    resume: bool | None = None

    def __post_init__(self) -> None:
        validate_request_id(self.request_id)
        _validate(TENANT_PATTERN, "tenant", self.tenant)
        _validate(DEFINITION_PATTERN, "definition", self.definition)
        if self.job_id is not None:
            _validate(REQUEST_ID_PATTERN, "jobId", self.job_id)
        if self.priority is not None:
            _validate(PRIORITY_PATTERN, "priority", self.priority)
        if not isinstance(self.input, Mapping):
            raise InvalidInput("input", "must be a JSON object")
        if self.task_key is not None and (
            not isinstance(self.task_key, str) or not 0 < len(self.task_key) <= MAX_TASK_KEY
        ):
            raise InvalidInput("taskKey", f"must be text of 1 to {MAX_TASK_KEY} characters")
        if self.submitted_at_ms is not None and not 0 <= self.submitted_at_ms <= MAX_EPOCH_MS:
            raise InvalidInput("submittedAt", "must be epoch milliseconds up to the year 9999")
        if self.not_before_ms is not None and not 0 <= self.not_before_ms <= MAX_EPOCH_MS:
            raise InvalidInput("notBefore", "must be epoch milliseconds up to the year 9999")
        if self.resume is not None and not isinstance(self.resume, bool):
            raise InvalidInput("resume", f"must be true or false, got {shown(self.resume)}")
        self._check_continuation()
        # The input is kept on the STATE item (under its envelope) and sent in events.
        check_storable(self.input, name="input", depth=2)
        if self.task_key is not None:
            check_storable(self.task_key, name="taskKey")

    def _check_continuation(self) -> None:
        if self.continues is not None:
            _validate(REQUEST_ID_PATTERN, "continues", self.continues)
            if self.continues == self.request_id:
                raise InvalidInput("continues", "a task cannot continue itself")
            if self.prompt is None:
                raise InvalidInput("prompt", "is required to continue a task (the follow-up)")
        if self.prompt is None:
            return
        if self.continues is None:
            raise InvalidInput("prompt", "is only for a task that continues another")
        if not isinstance(self.prompt, str) or not 0 < len(self.prompt) <= MAX_FOLLOW_UP:
            raise InvalidInput("prompt", f"must be text of 1 to {MAX_FOLLOW_UP} characters")
        check_storable(self.prompt, name="prompt")

    def to_body(self) -> str:
        """The message body; `InvalidInput` if it and its attributes pass SQS's limit
        (SQS counts both), before anything is written for the task."""
        body = json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)
        attributes = sum(len(name) + len(value["DataType"]) + len(value["StringValue"].encode())
                         for name, value in self.message_attributes().items())  # fmt: skip
        if len(body.encode()) + attributes > MAX_BODY_BYTES:
            raise InvalidInput("input", f"envelope exceeds {MAX_BODY_BYTES} bytes")
        return body

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": ENVELOPE_VERSION,
            "requestId": self.request_id,
            "tenant": self.tenant,
            "definition": self.definition,
            "input": dict(self.input),
            "jobId": self.job_id,
            "taskKey": self.task_key,
            "submittedAt": self.submitted_at_ms,
            **({"notBefore": self.not_before_ms} if self.not_before_ms is not None else {}),
        }
        if self.priority is not None:
            data["priority"] = self.priority
        if self.continues is not None:
            data.update(continues=self.continues, prompt=self.prompt)
        if self.resume is not None:
            data["resume"] = self.resume
        return data

    def send_fields(self) -> dict[str, Any]:
        """What SendMessage (or a batch entry) takes for this task: the body, the
        attributes, and the tenant as `MessageGroupId`, which makes a standard queue an
        SQS fair queue (a tenant taking a disproportionate share is de-prioritised)."""
        return {
            "MessageBody": self.to_body(),
            "MessageAttributes": self.message_attributes(),
            "MessageGroupId": self.tenant,
        }

    def message_attributes(self) -> dict[str, dict[str, str]]:
        attributes = {
            "requestId": {"DataType": "String", "StringValue": self.request_id},
            "tenant": {"DataType": "String", "StringValue": self.tenant},
            "taskType": {"DataType": "String", "StringValue": self.definition},
        }
        if self.job_id:
            attributes["jobId"] = {"DataType": "String", "StringValue": self.job_id}
        if self.priority:
            attributes["priority"] = {"DataType": "String", "StringValue": self.priority}
        return attributes

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, default_tenant: str) -> TaskEnvelope:
        if not isinstance(data, Mapping):
            raise InvalidInput("body", "must be a JSON object")
        if "definition" not in data:
            raise InvalidInput("definition", "is required")
        submitted = data.get("submittedAt")
        submitted_ms = int(submitted) if isinstance(submitted, int | float) else None
        not_before: int | None = None
        if data.get("delay") is not None:
            if data.get("notBefore") is not None:
                raise InvalidInput("delay", "give either delay or notBefore, not both")
            if submitted_ms is None:
                raise InvalidInput("delay", "needs submittedAt; give notBefore instead")
            not_before = resolve_not_before(delay_s=data["delay"], now_ms=submitted_ms)
        elif data.get("notBefore") is not None:
            not_before = parse_time_ms(data["notBefore"], "notBefore")
        return cls(
            request_id=data.get("requestId"),  # type: ignore[arg-type]  # validated
            tenant=data.get("tenant") or default_tenant,
            definition=data["definition"],
            input=data["input"] if data.get("input") is not None else {},
            job_id=data.get("jobId"),
            task_key=data.get("taskKey"),
            submitted_at_ms=submitted_ms,
            not_before_ms=not_before,
            priority=data.get("priority"),
            continues=data.get("continues"),
            prompt=data.get("prompt"),
            resume=data.get("resume"),
        )


def parse_message(
    body: str,
    attributes: Mapping[str, Any] | None,
    *,
    default_tenant: str,
) -> TaskEnvelope:
    """Validate an SQS message (attributes as SQS returns them) into an envelope.

    Raises `InvalidInput` naming the field for anything malformed.
    """
    if not isinstance(body, str):
        raise InvalidInput("body", "must be text")
    try:
        size = len(body.encode())
    except UnicodeEncodeError:
        raise InvalidInput("body", "holds a lone surrogate (not valid Unicode text)") from None
    if size > MAX_BODY_BYTES:
        raise InvalidInput("body", f"exceeds {MAX_BODY_BYTES} bytes")
    data = body.data if isinstance(body, DecodedBody) else decode_json(body)
    if not isinstance(data, dict):
        raise InvalidInput("body", "must be a JSON object")
    if data.get("detail-type") == "Task Requested" and isinstance(data.get("detail"), dict):
        event_time = data.get("time")
        data = data["detail"]
        if "submittedAt" not in data and isinstance(event_time, str):
            data = {**data, "submittedAt": parse_time_ms(event_time, "time")}
    attribute_id = _string_attribute(attributes, "requestId")
    if attribute_id is not None:
        validate_request_id(attribute_id)
        body_id = data.get("requestId")
        if body_id is not None and body_id != attribute_id:
            raise InvalidInput("requestId", "attribute and body disagree")
        data = {**data, "requestId": attribute_id}
    elif "requestId" not in data:
        raise InvalidInput("requestId", "missing: set the requestId message attribute")
    return TaskEnvelope.from_dict(data, default_tenant=default_tenant)


def _string_attribute(attributes: Mapping[str, Any] | None, name: str) -> str | None:
    """A message attribute's text; attributes come as SQS returns them (``DataType``,
    ``StringValue``) or as the Lambda event carries them (``dataType``, ``stringValue``)."""
    if not attributes or name not in attributes:
        return None
    value = attributes[name]
    if isinstance(value, Mapping):
        data_type = value.get("DataType", value.get("dataType", "String"))
        # "String.label" is a String with a custom label; Number and Binary are not.
        if not isinstance(data_type, str) or data_type.split(".", 1)[0] != "String":
            raise InvalidInput(
                name, f"message attribute must have DataType String, not {data_type!a:.40}"
            )
        value = value.get("StringValue", value.get("stringValue"))
    if not isinstance(value, str):
        raise InvalidInput(name, "message attribute must be a String")
    return value


def identity_hint(body: str, attributes: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(request id, tenant) read from a message that may not parse, for reporting it.

    Only an unambiguous, valid id counts: a String attribute and the body must not
    disagree. Never raises, whatever the message holds.
    """
    candidates: list[object] = []
    with contextlib.suppress(InvalidInput):
        candidates.append(_string_attribute(attributes, "requestId"))
    # Lenient: a NaN in the input must not hide the id its rejection is reported under.
    data = decode_or_none(body) if isinstance(body, str) else None
    tenant: str | None = None
    if isinstance(data, dict):
        if data.get("detail-type") == "Task Requested" and isinstance(data.get("detail"), dict):
            data = data["detail"]
        candidates.append(data.get("requestId"))
        if isinstance(data.get("tenant"), str) and TENANT_PATTERN.fullmatch(data["tenant"]):
            tenant = data["tenant"]
    valid = {c for c in candidates if isinstance(c, str) and REQUEST_ID_PATTERN.fullmatch(c)}
    if len(valid) == 1 and all(c in valid or c is None for c in candidates):
        return valid.pop(), tenant
    return None, tenant
