"""The copy mark when a sender used every message attribute: it never changes how the
body is judged (a body the strict reader refuses is left as it is)."""

from __future__ import annotations

from typing import Any

from agentq.envelope import MAX_BODY_BYTES
from worker.sqs.copies import MAX_ATTRIBUTES, REQUEUED_FROM, copied_from, marked_copy


def _message(body: str, attributes: int) -> dict[str, Any]:
    return {
        "MessageId": "m-1",
        "Body": body,
        "MessageAttributes": {
            f"a{n}": {"DataType": "String", "StringValue": "v"} for n in range(attributes)
        },
    }


def test_room_left_means_an_attribute_mark() -> None:
    body, attributes = marked_copy(_message('{"requestId": "r"}', MAX_ATTRIBUTES - 1))
    assert body == '{"requestId": "r"}'
    assert attributes[REQUEUED_FROM]["StringValue"] == "m-1"
    assert len(attributes) == MAX_ATTRIBUTES


def test_a_full_set_without_agentqs_own_marks_the_body() -> None:
    body, attributes = marked_copy(_message('{"requestId": "r", "input": {"é": 1}}', 10))
    assert len(attributes) == MAX_ATTRIBUTES and REQUEUED_FROM not in attributes
    assert copied_from({"Body": body, "MessageAttributes": attributes}) == "m-1"
    assert '"é"' in body  # kept as text, not escaped


def test_a_body_the_strict_reader_refuses_is_never_rewritten() -> None:
    for refused in (
        '{"input": NaN}',
        "[1, 2]",
        "not json",
        '{"big": "' + "x" * MAX_BODY_BYTES + '"}',
    ):
        body, _ = marked_copy(_message(refused, MAX_ATTRIBUTES))
        assert body == refused
        assert (
            copied_from(
                {"Body": body, "MessageAttributes": _message(body, 10)["MessageAttributes"]}
            )
            is None
        )
