"""The task envelope: agentq's wire format on the task queue.

A message body is a JSON object::

    {"version": 1, "requestId": "r-123", "tenant": "acme", "definition": "summarize",
     "input": {...}, "jobId": null, "taskKey": null, "submittedAt": 1732579200000}

with the message attribute `requestId` (String, ``^[a-zA-Z0-9_-]{1,256}$``) and, for
routing and metrics, `tenant`, `taskType`, `jobId` and `priority` (also in the body
when the producer chose one; docs/scheduling.md). A `Task Requested` event routed
from EventBridge arrives as the EventBridge envelope (no attributes); its `detail` holds
the same fields and is unwrapped here.

A message names a registered task definition, never code or an import path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.errors import InvalidInput, InvalidRequestId

REQUEST_ID_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_-]{1,256}$")
DEFINITION_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
TENANT_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
# A priority tier's name (which names exist is configuration: PRIORITIES).
PRIORITY_PATTERN: Final = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
MAX_BODY_BYTES: Final = 256 * 1024
ENVELOPE_VERSION: Final = 1


def validate_request_id(value: object) -> str:
    if not isinstance(value, str) or not REQUEST_ID_PATTERN.fullmatch(value):
        raise InvalidRequestId(value)
    return value


def _validate(pattern: re.Pattern[str], name: str, value: object) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(name, f"must match {pattern.pattern}, got {value!r:.80}")
    return value


@dataclass(frozen=True, kw_only=True)
class TaskEnvelope:
    request_id: str
    tenant: str
    definition: str
    input: Mapping[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    task_key: str | None = None
    submitted_at_ms: int | None = None
    priority: str | None = None  # None: the tier of the queue it arrived on

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

    def to_body(self) -> str:
        body = json.dumps(self.to_dict(), separators=(",", ":"))
        if len(body.encode()) > MAX_BODY_BYTES:
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
        }
        if self.priority is not None:
            data["priority"] = self.priority
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
        return cls(
            request_id=data.get("requestId"),  # type: ignore[arg-type]  # validated
            tenant=data.get("tenant") or default_tenant,
            definition=data["definition"],
            input=data["input"] if data.get("input") is not None else {},
            job_id=data.get("jobId"),
            task_key=data.get("taskKey"),
            submitted_at_ms=int(submitted) if isinstance(submitted, int | float) else None,
            priority=data.get("priority"),
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
    if len(body.encode()) > MAX_BODY_BYTES:
        raise InvalidInput("body", f"exceeds {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidInput("body", f"not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body", "must be a JSON object")
    if data.get("detail-type") == "Task Requested" and isinstance(data.get("detail"), dict):
        data = data["detail"]
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
    if not attributes or name not in attributes:
        return None
    value = attributes[name]
    if isinstance(value, Mapping):
        value = value.get("StringValue", value.get("stringValue"))
    if not isinstance(value, str):
        raise InvalidInput(name, "message attribute must be a String")
    return value
