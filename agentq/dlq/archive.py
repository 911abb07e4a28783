"""The dead-letter archive: messages from the task DLQ, as kept in S3, and a peek at the DLQ.

Every dead letter is archived (body, message attributes, what the processor did about
it) before anything else happens to it, so redrive can replay it whatever happens next.

Archive keys: ``{DLQ_ARCHIVE_PREFIX}{tenant}/{requestId}/{messageId}.json``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from agentq.envelope import identity_hint
from agentq.events import now_ms
from agentq.resources import DLQ_ARCHIVE_PREFIX

# "returned": sent back to the task queue because the task had attempts left; every
# other outcome but "lease-live" and "archived" means the task was dead-lettered.
DlqOutcome = Literal[
    "failed", "already-terminal", "lease-live", "malformed", "archived", "returned"
]


# (name → SendMessage-shaped attribute); binary values travel base64-encoded in JSON.
Attributes = dict[str, dict[str, str]]


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """One message taken from the DLQ, independent of who received it."""

    message_id: str
    body: str
    attributes: Attributes = field(default_factory=dict)
    system_attributes: dict[str, str] = field(default_factory=dict)
    source_arn: str | None = None

    @classmethod
    def from_lambda_record(cls, record: Mapping[str, Any]) -> DeadLetter:
        """From a record of the Lambda SQS event (lower-camel attribute shape)."""
        attributes: Attributes = {}
        for name, value in (record.get("messageAttributes") or {}).items():
            data_type = str(value.get("dataType", "String"))
            if value.get("stringValue") is not None:
                attributes[name] = {"DataType": data_type, "StringValue": value["stringValue"]}
            elif value.get("binaryValue") is not None:
                attributes[name] = {"DataType": data_type, "BinaryValue": value["binaryValue"]}
        return cls(
            message_id=str(record["messageId"]),
            body=str(record.get("body") or ""),
            attributes=attributes,
            system_attributes={k: str(v) for k, v in (record.get("attributes") or {}).items()},
            source_arn=record.get("eventSourceARN"),
        )

    @classmethod
    def from_sqs_message(cls, message: Mapping[str, Any]) -> DeadLetter:
        """From a `ReceiveMessage` result (upper-camel shape)."""
        attributes: Attributes = {}
        for name, value in (message.get("MessageAttributes") or {}).items():
            data_type = str(value.get("DataType", "String"))
            if "StringValue" in value:
                attributes[name] = {"DataType": data_type, "StringValue": value["StringValue"]}
            elif "BinaryValue" in value:
                encoded = base64.b64encode(value["BinaryValue"]).decode()
                attributes[name] = {"DataType": data_type, "BinaryValue": encoded}
        return cls(
            message_id=str(message["MessageId"]),
            body=str(message.get("Body") or ""),
            attributes=attributes,
            system_attributes={k: str(v) for k, v in (message.get("Attributes") or {}).items()},
        )

    def request_id_hint(self) -> str | None:
        """The request id from the attribute or body, if it looks valid (no full parse)."""
        return identity_hint(self.body, self.attributes)[0]


@dataclass(frozen=True, kw_only=True)
class ArchivedMessage:
    """A dead letter as kept in S3, with what the processor did about it."""

    key: str
    message_id: str
    request_id: str | None
    tenant: str | None
    body: str
    attributes: Attributes
    system_attributes: dict[str, str]
    archived_at_ms: int
    outcome: DlqOutcome = "archived"
    detail: str | None = None
    redriven_at_ms: int | None = None
    redrive_count: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> ArchivedMessage:
        return cls(**json.loads(raw))

    def send_attributes(self) -> dict[str, dict[str, Any]]:
        """The attributes in SendMessage's shape (binary values decoded)."""
        return send_attributes(self.attributes)


def send_attributes(attributes: Attributes) -> dict[str, dict[str, Any]]:
    """Archived or received attributes in SendMessage's shape (binary values decoded)."""
    result: dict[str, dict[str, Any]] = {}
    for name, value in attributes.items():
        if "BinaryValue" in value:
            result[name] = {
                "DataType": value["DataType"],
                "BinaryValue": base64.b64decode(value["BinaryValue"]),
            }
        else:
            result[name] = dict(value)
    return result


def archive_key(tenant: str, request_id: str, message_id: str) -> str:
    return f"{DLQ_ARCHIVE_PREFIX}{tenant}/{request_id}/{message_id}.json"


class DlqArchive:
    """Archived dead letters in the artifacts bucket. The S3 client is passed in."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3 = s3
        self.bucket = bucket

    def put(self, message: ArchivedMessage) -> None:
        self._s3.put_object(
            Bucket=self.bucket,
            Key=message.key,
            Body=message.to_json().encode(),
            ContentType="application/json",
        )

    def get(self, key: str) -> ArchivedMessage:
        response = self._s3.get_object(Bucket=self.bucket, Key=key)
        return ArchivedMessage.from_json(response["Body"].read())

    def keys(self, *, request_id: str | None = None) -> Iterator[str]:
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=DLQ_ARCHIVE_PREFIX):
            for item in page.get("Contents", []):
                key = str(item["Key"])
                # {prefix}{tenant}/{requestId}/{messageId}.json: match the id segment exactly.
                parts = key[len(DLQ_ARCHIVE_PREFIX) :].split("/")
                if request_id is None or (len(parts) == 3 and parts[1] == request_id):
                    yield key

    def list(self, *, request_id: str | None = None) -> list[ArchivedMessage]:
        messages = [self.get(key) for key in self.keys(request_id=request_id)]
        return sorted(messages, key=lambda m: m.archived_at_ms)

    def mark_redriven(self, message: ArchivedMessage) -> ArchivedMessage:
        updated = replace(message, redriven_at_ms=now_ms(), redrive_count=message.redrive_count + 1)
        self.put(updated)
        return updated


def peek(sqs: Any, dlq_url: str, *, max_messages: int = 10) -> list[DeadLetter]:
    """Messages waiting in the DLQ itself (not yet processed), without consuming them.

    VisibilityTimeout=0 leaves them visible; the receive still counts as a receive.
    """
    response = sqs.receive_message(
        QueueUrl=dlq_url,
        MaxNumberOfMessages=min(max_messages, 10),
        VisibilityTimeout=0,
        WaitTimeSeconds=0,
        MessageAttributeNames=["All"],
        AttributeNames=["All"],
    )
    return [DeadLetter.from_sqs_message(m) for m in response.get("Messages", [])]
