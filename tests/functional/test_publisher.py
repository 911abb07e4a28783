"""The EventBridge publisher against moto's server (events land in a rule's target queue)."""

from __future__ import annotations

import json
from typing import Any

from conftest import Stack

from agentq.events import DETAIL_TYPES, task_event
from agentq.publisher import EventPublisher
from agentq.resources import SAVE_EVENT_RULE, SAVE_EVENT_SKIPPED_TYPES


class _CountingEvents:
    def __init__(self, client: Any, fail_first: int = 0) -> None:
        self._client = client
        self.calls: list[int] = []
        self._fail_first = fail_first

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.calls.append(len(Entries))
        if self._fail_first:
            # Fail the first N entries of this call the way EventBridge reports it.
            failing = min(self._fail_first, len(Entries))
            self._fail_first -= failing
            response = self._client.put_events(Entries=Entries[failing:])
            results = [{"ErrorCode": "ThrottlingException", "ErrorMessage": "slow"}] * failing
            return {"FailedEntryCount": failing, "Entries": results + response["Entries"]}
        passed: dict[str, Any] = self._client.put_events(Entries=Entries)
        return passed


def _drain(stack: Stack) -> list[dict[str, Any]]:
    url = stack.resources.target_queues[SAVE_EVENT_RULE.name]
    bodies: list[dict[str, Any]] = []
    while True:
        got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = got.get("Messages", [])
        if not messages:
            return bodies
        for message in messages:
            bodies.append(json.loads(message["Body"]))
            stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def _publisher(stack: Stack, events_client: Any) -> EventPublisher:
    return EventPublisher(
        events_client,
        bus_name=stack.resources.bus_name,
        source="agentq",
        s3_client=stack.s3,
        bucket=stack.resources.bucket,
        sleep=lambda _: None,
    )


def test_twenty_five_events_take_three_calls(stack: Stack) -> None:
    counting = _CountingEvents(stack.events)
    events = [task_event("Task Pending", request_id=f"r{i}", tenant="t") for i in range(25)]
    _publisher(stack, counting).publish_all(events)
    assert counting.calls == [10, 10, 5]
    delivered = _drain(stack)
    assert sorted(b["detail"]["requestId"] for b in delivered) == sorted(f"r{i}" for i in range(25))


def test_oversize_payload_goes_to_s3_with_a_pointer(stack: Stack) -> None:
    big = "x" * 300_000
    event = task_event("Task Completed", request_id="big-1", tenant="t", transcript=big)
    publisher = _publisher(stack, stack.events)
    publisher.publish(event)
    [delivered] = _drain(stack)
    pointer = delivered["detail"]["payloadPointer"]
    assert delivered["detail"]["payload"] == {}
    stored = stack.s3.get_object(Bucket=pointer["bucket"], Key=pointer["key"])["Body"].read()
    assert json.loads(stored) == {"transcript": big}
    assert pointer["size"] == len(stored)
    assert publisher.stats.overflowed == 1


def test_partially_failed_entries_are_retried(stack: Stack) -> None:
    counting = _CountingEvents(stack.events, fail_first=3)
    events = [task_event("Task Pending", request_id=f"p{i}", tenant="t") for i in range(8)]
    publisher = _publisher(stack, counting)
    publisher.publish_all(events)
    assert counting.calls == [8, 3]
    assert publisher.stats.retried == 3
    assert len(_drain(stack)) == 8


def test_save_event_rule_routes_what_save_event_stores_and_not_what_it_skips(
    stack: Stack,
) -> None:
    """Heartbeats (every 20 s per running task) and requests never reach save-event; every
    type it stores does, on the local stack as the deployed rule (agentq.resources)."""
    stored = [t for t in DETAIL_TYPES if t not in SAVE_EVENT_SKIPPED_TYPES]
    events = [
        task_event(t, request_id=f"k{i}", tenant="t", job_id="j1")
        for i, t in enumerate(DETAIL_TYPES)
    ]
    _publisher(stack, stack.events).publish_all(events)
    delivered = _drain(stack)
    assert sorted(b["detail-type"] for b in delivered) == sorted(stored)
    assert {"Task Heartbeat", "Task Requested"} == set(SAVE_EVENT_SKIPPED_TYPES)
