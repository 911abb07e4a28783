"""save-event: idempotent persistence of EventBridge-delivered events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack
from hypothesis import given, settings
from hypothesis import strategies as st
from lambda_support import eventbridge_envelope

from agentq.config import Settings
from agentq.events import Event, task_event
from agentq.local.lambda_host import local_context
from agentq.store import EventStore, keys
from agentq.store.codec import to_item
from agentq.store.events import event_item
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


def _nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"leaf": 1}
    for _ in range(depth):
        value = {"n": value}
    return value


SECRET = "do-not-log-this-payload"


# Forged `source=agentq` events whose item DynamoDB (or the item's own build) refuses:
# each must be counted malformed and dropped, never raised (EventBridge would retry it).
@pytest.mark.parametrize(
    "change",
    [
        {"timestampMs": 10**20},  # past datetime's range: OSError/OverflowError
        {"timestampMs": -(10**18)},  # ValueError: year out of range
        {"attempt": 10**40},  # more digits than a DynamoDB number holds
        {"payload": {"n": 10**40, "s": SECRET}},
        {"payload": {"n": 1e200, "s": SECRET}},
        {"payloadPointer": "abc"},  # not an object
        {"payload": {"": SECRET}},  # DynamoDB: empty attribute name
        {"payload": {"s": SECRET, **_nested(40)}},  # deeper than DynamoDB's 32 levels
        {"payload": {"s": SECRET + "\ud800"}},  # a lone surrogate: not UTF-8
        {"eventId": "e" * 2000},  # the sort key would pass DynamoDB's 1,024 bytes
        {"tenant": "t" * 3000},  # the partition key would pass its 2,048 bytes
    ],
    ids=[
        "huge-timestamp",
        "negative-timestamp",
        "huge-attempt",
        "huge-int-payload",
        "huge-float-payload",
        "pointer-not-object",
        "empty-key",
        "too-deep",
        "lone-surrogate",
        "long-event-id",
        "long-tenant",
    ],
)
def test_events_dynamodb_would_refuse_are_malformed_not_raised(
    stack: Stack,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    change: dict[str, object],
) -> None:
    event = task_event("Task Completed", request_id="r-hostile", tenant="acme")
    envelope = eventbridge_envelope(event)
    envelope["detail"].update(change)
    capsys.readouterr()

    assert save_event.handler(envelope, CTX) == {"outcome": "malformed"}

    metrics = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [m["EventsMalformed"] for m in metrics if "EventsMalformed" in m] == [[1.0]]
    (warning,) = [r for r in caplog.records if r.getMessage() == "malformed event rejected"]
    assert warning.reason and warning.eventBridgeId == envelope["id"]  # type: ignore[attr-defined]
    # The log names the problem, never the content.
    assert not [r for r in caplog.records if SECRET in r.getMessage() + str(r.__dict__)]
    items = stack.dynamodb.scan(TableName=stack.resources.table_name)["Items"]
    assert [i for i in items if i["SK"]["S"].startswith(keys.EVENT_SK_PREFIX)] == []


def test_a_valid_event_at_the_limits_is_stored_as_before(stack: Stack) -> None:
    # What the new checks must not refuse: the deepest storable payload, 38-digit
    # numbers, the largest timestamp a date can show, a pointer object.
    event = task_event("Task Completed", request_id="r-edge", tenant="acme")
    envelope = eventbridge_envelope(event)
    payload = {"big": 10**37, "small": 1e-100, "deep": _nested(28)}
    envelope["detail"].update(payload=payload, timestampMs=253_402_300_799_000, attempt=10**9)

    assert save_event.handler(envelope, CTX) == {"outcome": "stored"}
    (item,) = _store(stack).timeline("acme", "r-edge")
    assert (item["payload"], item["attempt"]) == (payload, 10**9)
    assert item["timestamp"] == "9999-12-31T23:59:59.000+00:00"


class _WritingStore:
    """Stands in for EventStore: builds and serializes the item as `append` does, then
    asserts what DynamoDB would refuse and boto3 does not check before sending."""

    def append(self, event: Event, *, ttl_days: int = 0) -> bool:
        item = event_item(event, app_name="agentq", ttl_days=ttl_days)
        to_item(item)  # raises on a number DynamoDB cannot hold
        json.dumps(item).encode()  # raises on a lone surrogate
        assert _deepest(item) <= 32
        assert len(item["PK"].encode()) <= 2048 and len(item["SK"].encode()) <= 1024
        return True


def _deepest(value: object, level: int = 0) -> int:
    if isinstance(value, dict):
        assert all(key for key in value), "an empty attribute name"
        return max([_deepest(v, level + 1) for v in value.values()], default=level)
    if isinstance(value, list):
        return max([_deepest(v, level + 1) for v in value], default=level)
    return level


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=12,
)  # fmt: skip
_DETAILS = st.fixed_dictionaries(
    {"eventId": st.text(min_size=1, max_size=1200), "requestId": st.just("r-prop"),
     "tenant": st.text(min_size=1, max_size=2100),
     "timestampMs": st.integers(-(10**20), 10**20) | st.floats(-1e20, 1e20)},
    optional={"attempt": st.integers() | st.floats(0, 1e50), "payload": _JSON,
              "payloadPointer": _JSON, "jobId": _JSON, "workerId": _JSON},
)  # fmt: skip


@given(detail=_DETAILS | st.builds(lambda d, n: {**d, "payload": _nested(n)}, _DETAILS,
                                   st.integers(0, 40)))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_any_forged_detail_is_stored_storably_or_counted_malformed(detail: dict[str, Any]) -> None:
    envelope = {"version": "0", "id": "e", "detail-type": "Task Completed", "source": "agentq",
                "account": "1", "time": "2026-01-01T00:00:00Z", "region": "eu-west-1",
                "resources": [], "detail": detail}  # fmt: skip
    config = Settings.from_env({})
    assert save_event.save(envelope, _WritingStore(), config) in ("stored", "malformed")  # type: ignore[arg-type]
