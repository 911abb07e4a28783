"""The tier receiver (worker.receive.tiers): the forward check, starvation turns and capped polls."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentq.config import Settings
from agentq.envelope import DecodedBody, parse_message
from agentq.errors import InvalidInput
from worker.receive.tiers import TierReceiver

# -- the forward check decodes a body once and hands it on ------------------------------------
priorities = st.sampled_from(["high", "normal", "low", "urgent", "HIGH", ""])
inputs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(priority=priorities, payload=inputs, as_event=st.booleans())
def test_the_forward_check_hands_on_the_body_it_decoded_and_the_parser_uses_it(
    priority: str, payload: Any, as_event: bool
) -> None:
    data: dict[str, Any] = {"requestId": "r-1", "definition": "sample-noop", "input": payload}
    if priority:
        data["priority"] = priority
    if as_event:
        data = {"detail-type": "Task Requested", "detail": data}
    text = json.dumps(data)
    settings_ = Settings(queue_url="https://q/normal",
                         queue_urls="high=https://q/high,normal=https://q/normal,low=https://q/low")  # fmt: skip
    receiver = TierReceiver(settings_, sqs=None)
    message: dict[str, Any] = {"Body": text, "ReceiptHandle": "h"}
    destination = receiver.destination(message, "normal")
    body = message["Body"]
    assert isinstance(body, DecodedBody) and body == text, "still the same text everywhere"
    assert body.data == data
    expected = {"high": "https://q/high", "low": "https://q/low"}.get(priority)
    assert destination == expected
    assert outcome(body) == outcome(text), "the decoded body parses as its text does"


def outcome(body: str) -> object:
    try:
        return parse_message(body, None, default_tenant="acme")
    except InvalidInput as exc:
        return str(exc)


def test_a_body_the_forward_check_cannot_decode_is_left_as_text() -> None:
    settings_ = Settings(
        queue_url="https://q/normal", queue_urls="high=https://q/high,normal=https://q/normal"
    )
    message: dict[str, Any] = {"Body": "[" * 10_000, "ReceiptHandle": "h"}
    assert TierReceiver(settings_, sqs=None).destination(message, "normal") is None
    assert not isinstance(message["Body"], DecodedBody)


# -- starvation turns and capped receives -------------------------------------------------
def test_the_watchers_wait_while_a_starvation_turn_is_being_received() -> None:
    settings_ = Settings(
        queue_url="https://q/normal",
        queue_urls="high=https://q/high,normal=https://q/normal,low=https://q/low",
        starvation_bound_ms=1000,
    )
    now = [0.0]

    class Queues:
        def receive_message(self, **kwargs: Any) -> dict[str, Any]:
            # While low's turn is in the receive, no watcher may start a poll of its own.
            assert not receiver.may_watch("high") and not receiver.may_watch("normal")
            assert receiver.may_watch("low")
            return {"Messages": [{"MessageId": "m", "ReceiptHandle": "h", "Body": "{}"}]}

    receiver = TierReceiver(settings_, sqs=Queues(), clock=lambda: now[0])
    for tier in ("high", "normal"):
        receiver.scheduler.received(tier, asked=1, got=1, now=0.0)  # work: never idle
        receiver.scheduler.state[tier].last_poll = 5.0
    now[0] = 5.0  # low: never received from, past the 1 s bound
    pick, messages = receiver.receive({"high": 1, "normal": 1, "low": 1})
    assert pick is not None and pick.tier == "low" and pick.overdue and len(messages) == 1
    assert not receiver.may_watch("high"), "until the turn's message is in the intake"
    receiver.turn_taken()
    assert receiver.may_watch("high")


def test_a_starvation_turn_asks_for_a_message_per_slot_and_other_picks_for_their_room() -> None:
    """Under higher work a low tier's room is one place; its turn takes a slot's worth,
    so its share of a saturated fleet is not one task per worker per bound."""
    asked: dict[str, list[int]] = {"high": [], "low": []}

    class Sqs:
        def receive_message(self, **request: Any) -> dict[str, Any]:
            tier = request["QueueUrl"].rsplit("/", 1)[1]
            asked[tier].append(request["MaxNumberOfMessages"])
            body = {"MessageId": "m", "ReceiptHandle": "h", "Body": "{}"}
            return {"Messages": [body] * request["MaxNumberOfMessages"]}

    settings_ = Settings(queue_url="https://q/high", queue_urls="high=https://q/high,low=https://q/low",
                         starvation_bound_ms=1000, max_concurrent=4)  # fmt: skip
    now = [0.0]
    receiver = TierReceiver(settings_, sqs=Sqs(), clock=lambda: now[0])
    receiver.scheduler.received("high", asked=1, got=1, now=0.0)
    receiver.scheduler.state["high"].last_poll = 5.0
    rooms = {"high": 2, "low": 1}
    now[0] = 5.0  # low never received from: past its 1 s bound
    turn, _ = receiver.receive(rooms)
    receiver.turn_taken()
    following, _ = receiver.receive(rooms)
    assert turn is not None and turn.tier == "low" and turn.overdue
    assert following is not None and following.tier == "high" and not following.overdue
    assert asked == {"high": [2], "low": [4]}
