"""save-event: idempotent persistence of EventBridge-delivered events."""

from __future__ import annotations

import pytest
from conftest import Stack
from lambda_support import eventbridge_envelope

from agentq.events import task_event
from agentq.local.lambda_host import local_context
from agentq.store import EventStore
from lambdas import save_event

pytestmark = pytest.mark.timeout(120)
CTX = local_context("save-event")


def _store(stack: Stack) -> EventStore:
    return EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")


def test_duplicate_delivery_stores_one_item(stack: Stack) -> None:
    event = task_event("Task Completed", request_id="r-dup", tenant="acme", attempt=1)
    envelope = eventbridge_envelope(event)

    first = save_event.handler(envelope, CTX)
    # EventBridge redelivers with a fresh envelope id; the agentq event id is the key.
    second = save_event.handler({**envelope, "id": "another-delivery"}, CTX)

    assert (first["outcome"], second["outcome"]) == ("stored", "duplicate")
    timeline = _store(stack).timeline("acme", "r-dup")
    assert [(e["eventId"], e["detailType"]) for e in timeline] == [
        (event.event_id, "Task Completed")
    ]
    assert timeline[0]["ttl"] == (event.timestamp_ms + 30 * 86_400_000) // 1000


def test_timeline_is_in_event_time_order_whatever_the_delivery_order(stack: Stack) -> None:
    base = 1_760_000_000_000
    kinds = ["Task Pending", "Task Processing Started", "Task Processing Failed",
             "Task Processing Started", "Task Completed"]  # fmt: skip
    events = [
        task_event(kind, request_id="r-order", tenant="acme", attempt=i)  # type: ignore[arg-type]
        for i, kind in enumerate(kinds)
    ]
    events = [e.__class__(**{**e.__dict__, "timestamp_ms": base + i * 1000})
              for i, e in enumerate(events)]  # fmt: skip
    for event in reversed(events):
        save_event.handler(eventbridge_envelope(event), CTX)

    timeline = _store(stack).timeline("acme", "r-order")
    assert [e["eventId"] for e in timeline] == [e.event_id for e in events]
    assert [e["detailType"] for e in timeline] == kinds


def test_oversize_payload_keeps_the_pointer_not_the_blob(stack: Stack) -> None:
    pointer = {"bucket": stack.resources.bucket, "key": "events/overflow/acme/r-big/e.json",
               "size": 400_000}  # fmt: skip
    event = task_event("Task Completed", request_id="r-big", tenant="acme").with_pointer(pointer)

    assert save_event.handler(eventbridge_envelope(event), CTX)["outcome"] == "stored"

    (item,) = _store(stack).timeline("acme", "r-big")
    assert item["payloadPointer"] == pointer
    assert item["payload"] == {}


def test_heartbeats_are_not_persisted_unless_asked(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = task_event("Task Heartbeat", request_id="r-beat", tenant="acme",
                      effective_until_ms=1_900_000_000_000)  # fmt: skip
    assert save_event.handler(eventbridge_envelope(beat), CTX)["outcome"] == "skipped"
    assert _store(stack).timeline("acme", "r-beat") == []

    monkeypatch.setenv("PERSIST_HEARTBEATS", "true")
    assert save_event.handler(eventbridge_envelope(beat), CTX)["outcome"] == "stored"
    assert len(_store(stack).timeline("acme", "r-beat")) == 1


def test_a_documented_task_requested_event_is_skipped_not_malformed(stack: Stack) -> None:
    # The producers page's example, as the bus delivers it to every agentq rule.
    envelope = {
        "version": "0", "id": "e-1", "detail-type": "Task Requested", "source": "agentq",
        "account": "123456789012", "time": "2026-11-25T10:00:00Z", "region": "eu-west-1",
        "resources": [],
        "detail": {"requestId": "billing-run-2026-11-25", "definition": "summarize",
                   "tenant": "acme", "input": {"document": "..."}},
    }  # fmt: skip
    assert save_event.handler(envelope, CTX) == {"outcome": "skipped"}
    assert _store(stack).timeline("acme", "billing-run-2026-11-25") == []


@pytest.mark.parametrize(
    "mangle",
    [
        lambda e: {**e, "detail": {**e["detail"], "requestId": "bad id!"}},
        lambda e: {**e, "detail-type": "Task Exploded"},
        lambda e: {**e, "detail": "not an object"},
        lambda e: {k: v for k, v in e.items() if k != "detail"},
        lambda e: {**e, "source": "someone-else"},
    ],
    ids=["bad-request-id", "unknown-type", "detail-not-object", "no-detail", "foreign-source"],
)
def test_malformed_events_are_rejected_without_raising(stack: Stack, mangle: object) -> None:
    event = task_event("Task Completed", request_id="r-bad", tenant="acme")
    envelope = mangle(eventbridge_envelope(event))  # type: ignore[operator]

    assert save_event.handler(envelope, CTX) == {"outcome": "malformed"}
    assert _store(stack).timeline("acme", "r-bad") == []
