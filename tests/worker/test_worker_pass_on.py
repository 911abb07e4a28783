"""A watched tier's message whose long poll outlived the free slot it asked for is
passed on to the fleet, once, instead of waiting here for a hand-over."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import new_id, running_worker, send

from agentq.config import Settings
from agentq.envelope import TaskEnvelope, parse_message
from agentq.local.workers import SAMPLE_DEFINITIONS
from worker.app import build
from worker.inflight import InFlight
from worker.receive.receivers import PassOn
from worker.sqs.batcher import is_copy
from worker.sqs.copies import MAX_ATTRIBUTES, REQUEUED_FROM, copied_from


def receive_high(stack: Stack) -> dict[str, Any]:
    got: list[dict[str, Any]] = []

    def received() -> bool:
        reply = stack.sqs.receive_message(
            QueueUrl=stack.resources.tier_queues["high"], MaxNumberOfMessages=1,
            VisibilityTimeout=300, MessageAttributeNames=["All"],
            AttributeNames=["All"],
        )  # fmt: skip
        got.extend(reply.get("Messages", []))
        return bool(got)

    wait_for(received, timeout=30, message="the high message received")
    return got[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("pass_on", "full", "copy", "passed"), [
    ("if_full", True, False, True),  # asked for a free slot that filled: passed on
    ("if_full", False, False, False),  # its slot is still free: it starts here
    ("never", True, False, False),  # received for a reserve place: it waits here
    ("if_full", True, True, False),  # already passed on once: it stays
    # The receive loop's, every slot busy and none freed yet (no prefetch): passed on.
    ("if_surplus", True, False, True),
    ("if_surplus", False, False, False),  # a free slot: it starts here
])  # fmt: skip
def test_a_watched_message_that_finds_its_free_slot_taken_is_passed_on_at_once(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch,
    pass_on: PassOn, full: bool, copy: bool, passed: bool,
) -> None:  # fmt: skip
    monkeypatch.setenv("WARM_CHILDREN", "false")
    # A window far longer than the test's wait: a pass-on must not wait for companions.
    monkeypatch.setenv("SQS_BATCH_WINDOW", "60000")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    consumer = build(Settings.from_env()).consumer
    started: list[str] = []
    monkeypatch.setattr(consumer, "_slot", lambda message, *_: started.append("started"))
    monkeypatch.setattr(consumer, "_prepare_ahead", lambda held: held)
    for n in range(consumer.slots.size if full else consumer.slots.size - 1):
        assert consumer.slots.offer(({}, InFlight(message_id=f"busy-{n}", receipt_handle=""), None))
    sent = send(inproc_stack, "sample-echo", {"text": "hi"}, priority="high")
    message = receive_high(inproc_stack)
    if copy:
        message["MessageAttributes"][REQUEUED_FROM] = {"DataType": "String",
                                                       "StringValue": "an-earlier-id"}  # fmt: skip
    # What the receiving thread does first: the message is settled on its own tier.
    consumer._batcher.routes.note(
        message["ReceiptHandle"], inproc_stack.resources.tier_queues["high"]
    )
    try:
        consumer._accept(message, "high", pass_on=pass_on)
        if not passed:
            assert "passed_on" not in consumer.verdicts
            if full:
                assert consumer.slots.buffered == 1, "it waits here for the next hand-over"
            else:
                wait_for(lambda: started == ["started"], timeout=10, message="it started")
            return
        assert consumer.verdicts == {"passed_on": 1}
        assert consumer.slots.buffered == 0 and len(consumer._inflight) == 0
        # A fresh copy (no receive spent), visible now, naming the message it replaces;
        # the original deleted. Well inside the batch window: it did not wait for it.
        forwarded = receive_high(inproc_stack)
        assert forwarded["MessageId"] != message["MessageId"]
        assert forwarded["Attributes"]["ApproximateReceiveCount"] == "1"
        assert forwarded["MessageAttributes"][REQUEUED_FROM]["StringValue"] == message["MessageId"]
        assert json.loads(forwarded["Body"])["requestId"] == sent.request_id
        wait_for(lambda: _not_visible(inproc_stack) == 1, timeout=10,
                 message="the original deleted (only the copy in flight)")  # fmt: skip
    finally:
        consumer._batcher.close(timeout_s=1)
        consumer._events.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentq_attributes", [True, False])
def test_a_copy_of_a_message_with_ten_attributes_is_marked_and_never_passed_on_again(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch, agentq_attributes: bool
) -> None:
    """SQS takes at most 10 message attributes. A sender that used them all still gets a
    marked copy: agentq's `taskType` gives way to the mark, or, with none of agentq's
    attributes to give, the body carries it. Either way the copy stays where it lands."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "60000")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    consumer = build(Settings.from_env()).consumer
    monkeypatch.setattr(consumer, "_prepare_ahead", lambda held: held)
    for n in range(consumer.slots.size):
        assert consumer.slots.offer(({}, InFlight(message_id=f"busy-{n}", receipt_handle=""), None))
    envelope = TaskEnvelope(request_id=new_id("high"), tenant="acme", definition="sample-echo",
                            input={"text": "hi"}, priority="high")  # fmt: skip
    attributes: dict[str, Any] = (
        envelope.message_attributes() if agentq_attributes
        else {"requestId": {"DataType": "String", "StringValue": envelope.request_id}}
    )  # fmt: skip
    own = {f"sender{n}": {"DataType": "String", "StringValue": f"v{n}"}
           for n in range(MAX_ATTRIBUTES - len(attributes))}  # fmt: skip
    inproc_stack.sqs.send_message(
        QueueUrl=inproc_stack.resources.tier_queues["high"], MessageBody=envelope.to_body(),
        MessageAttributes={**attributes, **own},
    )  # fmt: skip
    message = receive_high(inproc_stack)
    assert len(message["MessageAttributes"]) == MAX_ATTRIBUTES
    consumer._batcher.routes.note(
        message["ReceiptHandle"], inproc_stack.resources.tier_queues["high"]
    )
    try:
        consumer._accept(message, "high", pass_on="if_full")
        assert consumer.verdicts == {"passed_on": 1}
        copy = receive_high(inproc_stack)
        assert copy["MessageId"] != message["MessageId"]
        assert is_copy(copy) and copied_from(copy) == message["MessageId"]
        assert len(copy["MessageAttributes"]) <= MAX_ATTRIBUTES
        for name, value in own.items():  # the sender's own attributes are all kept
            assert copy["MessageAttributes"][name]["StringValue"] == value["StringValue"]
        # The copy reads as the same task.
        parsed = parse_message(copy["Body"], copy["MessageAttributes"], default_tenant="acme")
        assert parsed.to_dict() == envelope.to_dict()
        consumer._batcher.routes.note(
            copy["ReceiptHandle"], inproc_stack.resources.tier_queues["high"]
        )
        consumer._accept(copy, "high", pass_on="if_full")
        assert consumer.verdicts == {"passed_on": 1}, "a copy is not passed on again"
        assert consumer.slots.buffered == 1, "it waits here for the next hand-over"
    finally:
        consumer._batcher.close(timeout_s=1)
        consumer._events.close()


def _not_visible(stack: Stack) -> int:
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.tier_queues["high"],
        AttributeNames=["ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.timeout(120)
def test_a_high_task_caught_by_a_busy_workers_long_poll_runs_on_the_idle_one(
    stack: Stack,
) -> None:
    """One slot each. The first worker's high-tier long poll (20 s) starts while its slot
    is free; a long low task then takes the slot, and the high task sent next comes to
    that poll. Held there, it would start only when the low task ends; passed on, the
    second worker runs it meanwhile."""
    events = EventLog(stack)
    one_slot = {"MAX_CONCURRENT_CLAUDE": "1", "PREFETCH_HORIZON": "0"}
    with running_worker(stack, "busy", WAIT_TIME_SECONDS="20", **one_slot) as busy:
        busy.wait_for_output("worker started")  # its long polls out, for its free slot
        low = send(stack, "sample-sleep", {"seconds": 30}, priority="low")
        events.wait(low.request_id, "Task Processing Started", timeout=30)
        high = send(stack, "sample-echo", {"text": "urgent"}, priority="high")
        busy.wait_for_output(high.request_id, timeout=30)  # in its hands first
        with running_worker(stack, "idle", **one_slot):
            events.wait(high.request_id, "Task Completed", timeout=60)
            assert not events.of(low.request_id, "Task Completed"), "the low task still runs"
        assert len(events.of(high.request_id, "Task Processing Started")) == 1
