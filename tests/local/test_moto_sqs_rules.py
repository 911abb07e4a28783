"""SQS limits AWS enforces and moto alone does not, enforced by the local server."""

from __future__ import annotations

from typing import Any

import moto.sqs.responses as sqs_responses
import pytest
from botocore.exceptions import ClientError
from conftest import Stack

from agentq.errors import IncompatibleDependency
from agentq.local.rules.sqs_message_attributes import MAX_MESSAGE_ATTRIBUTES
from agentq.local.rules.sqs_message_attributes import install as enforce_sqs_rules


def _attributes(count: int) -> dict[str, Any]:
    return {f"a{n}": {"DataType": "String", "StringValue": "v"} for n in range(count)}


def test_more_than_ten_message_attributes_are_refused_as_sqs_refuses_them(stack: Stack) -> None:
    url = stack.resources.queue_url
    stack.sqs.send_message(QueueUrl=url, MessageBody="ten",
                           MessageAttributes=_attributes(MAX_MESSAGE_ATTRIBUTES))  # fmt: skip
    with pytest.raises(ClientError) as refused:
        stack.sqs.send_message(QueueUrl=url, MessageBody="eleven",
                               MessageAttributes=_attributes(MAX_MESSAGE_ATTRIBUTES + 1))  # fmt: skip
    assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert "exceeds the allowed maximum [10]" in str(refused.value)
    with pytest.raises(ClientError, match="exceeds the allowed maximum"):
        stack.sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": "ok", "MessageBody": "ten", "MessageAttributes": _attributes(10)},
            {"Id": "no", "MessageBody": "eleven", "MessageAttributes": _attributes(11)},
        ])  # fmt: skip
    got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert [m["Body"] for m in got.get("Messages", [])] == ["ten"]


def test_a_changed_attribute_validator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqs_responses, "validate_message_attributes", lambda attrs, extra: None)
    with pytest.raises(IncompatibleDependency, match="validate_message_attributes"):
        enforce_sqs_rules()
