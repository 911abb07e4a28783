"""Which received messages are gated (locked before they take a slot), in-process."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from conftest import Stack
from support import wait_for
from worker_support import queue_counts, receive_all, send

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.local.workers import SAMPLE_DEFINITIONS
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from agentq.store.tenants import TenantLimitStore
from worker.app import build
from worker.receive.placement import Held


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("limit", "starving", "unlisted", "gated"), [
    ("2", False, False, True),  # a limited tenant: the lock first
    ("2", True, False, True),  # its tier's starvation turn too (a turn brings a slot's worth)
    ("0", False, False, False),  # no limit: the ordinary path
    ("0", False, True, True),  # the limits cannot be listed: its lock reads its limit first
])  # fmt: skip
def test_a_limited_tenants_message_is_gated_on_its_tiers_starvation_turn_too(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch, limit: str, starving: bool,
    unlisted: bool, gated: bool,
) -> None:  # fmt: skip
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", limit)
    consumer = build(Settings.from_env()).consumer
    if unlisted:

        def throttled() -> list[Any]:
            raise RuntimeError("throttled past every retry")

        monkeypatch.setattr(consumer._handler._preparer._limits._store, "overrides", throttled)
    paths: list[str] = []

    lock = Future[str]()  # a lock still being taken, until the test ends

    def prepare(*_: Any) -> str:
        return lock.result(timeout=30)

    def prepare_ahead(held: Held) -> Held:
        return held[0], held[1], Future()

    def gate(held: Held) -> None:
        paths.append("gate")

    def offer(held: Held, prepare: Any = None) -> bool:
        paths.append("offer")
        return False

    monkeypatch.setattr(consumer._handler, "prepare", prepare)
    monkeypatch.setattr(consumer, "_prepare_ahead", prepare_ahead)
    monkeypatch.setattr(consumer.slots, "gate", gate)
    monkeypatch.setattr(consumer.slots, "offer", offer)
    inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url, MessageBody="{}")
    [message] = receive_all(inproc_stack, 1)
    try:
        consumer._accept(message, Settings.from_env().default_priority, starving=starving)
        assert paths == (["gate"] if gated else ["offer"])
    finally:
        lock.set_result("duplicate")
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
def test_a_message_of_a_tenant_parked_full_goes_straight_back_unlocked(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tenant's parked messages here take the next seat first: this one goes back to
    the queue as a delayed fresh copy, without a lock, a slot or a buffer place."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "2")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))  # a task it knows
    consumer = build(Settings.from_env()).consumer
    locks: list[Any] = []
    monkeypatch.setattr(consumer._limited.seats, "full", lambda tenant: True)
    monkeypatch.setattr(consumer._limited, "lock", lambda *args: locks.append(args))
    send(inproc_stack, "sample-echo")
    [message] = receive_all(inproc_stack, 1)
    try:
        consumer._accept(message, Settings.from_env().default_priority)
        assert locks == [] and consumer.slots.buffered == 0 and consumer.slots.busy == 0
        assert consumer.verdicts == {"tenant_limit": 1}
        assert len(consumer._inflight) == 0
        assert consumer._batcher.flush()
        attributes = inproc_stack.sqs.get_queue_attributes(
            QueueUrl=inproc_stack.resources.queue_url,
            AttributeNames=["ApproximateNumberOfMessagesDelayed",
                            "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]  # fmt: skip
        # The received message deleted, a fresh copy waiting out the back-off.
        assert attributes == {"ApproximateNumberOfMessagesDelayed": "1",
                              "ApproximateNumberOfMessagesNotVisible": "0"}  # fmt: skip
    finally:
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
def test_a_task_not_yet_due_of_a_tenant_at_its_limit_waits_until_due_not_round(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its not-before is checked before its tenant's seats: sent back at the tenant's
    back-off (or parked), a delayed task went round every few seconds, each turn a
    receive, a send and a delete, and took park places that due tasks could use. It is
    re-delayed in place until due instead, with no seat asked for."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "2")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    consumer = build(Settings.from_env()).consumer
    monkeypatch.setattr(consumer._limited.seats, "full", lambda tenant: True)  # parked full
    envelope = TaskEnvelope(request_id="r-later", tenant="acme", definition="sample-echo",
                            input={}, not_before_ms=now_ms() + 600_000)  # fmt: skip
    inproc_stack.sqs.send_message(
        QueueUrl=inproc_stack.resources.queue_url, MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )  # fmt: skip
    [message] = receive_all(inproc_stack, 1)
    try:
        consumer._accept(message, Settings.from_env().default_priority)
        wait_for(lambda: consumer.verdicts.get("not_ready") == 1, timeout=30,
                 message=f"the task re-delayed until due ({consumer.verdicts})")  # fmt: skip
        assert "tenant_limit" not in consumer.verdicts
        assert consumer._batcher.flush()
        attributes = inproc_stack.sqs.get_queue_attributes(
            QueueUrl=inproc_stack.resources.queue_url,
            AttributeNames=["ApproximateNumberOfMessagesDelayed",
                            "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]  # fmt: skip
        # The same message, invisible until due: no fresh copy after a back-off.
        assert attributes == {"ApproximateNumberOfMessagesDelayed": "0",
                              "ApproximateNumberOfMessagesNotVisible": "1"}  # fmt: skip
        record = TaskStore(inproc_stack.dynamodb, inproc_stack.resources.table_name).get(
            "acme", "r-later"
        )
        assert record is not None and record.state is TaskState.SCHEDULED
    finally:
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [
    "{}",  # no task in it
    '{"requestId": "r-1", "tenant": "acme", "definition": "no-such-definition"}',
    "\x00not json",
])  # fmt: skip
def test_a_malformed_message_of_a_tenant_parked_full_is_rejected_not_sent_round(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    """Sent back unread, a malformed message would go round for as long as its tenant
    stays at its limit, a fresh copy each time (so never dead-lettered). It is gated
    instead, and its preparation records it failed and deletes it."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "2")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    consumer = build(Settings.from_env()).consumer
    monkeypatch.setattr(consumer._limited.seats, "full", lambda tenant: True)
    inproc_stack.sqs.send_message(
        QueueUrl=inproc_stack.resources.queue_url, MessageBody=body,
        MessageAttributes={"tenant": {"DataType": "String", "StringValue": "acme"}},
    )  # fmt: skip
    [message] = receive_all(inproc_stack, 1)
    try:
        consumer._accept(message, Settings.from_env().default_priority)
        wait_for(lambda: consumer.verdicts.get("rejected") == 1, timeout=30,
                 message=f"the message rejected ({consumer.verdicts})")  # fmt: skip
        assert "tenant_limit" not in consumer.verdicts
        assert consumer._batcher.flush() and consumer._events.flush()
        wait_for(lambda: queue_counts(inproc_stack) == (0, 0), timeout=30,
                 message="the message deleted, no copy sent")  # fmt: skip
        attributes = inproc_stack.sqs.get_queue_attributes(
            QueueUrl=inproc_stack.resources.queue_url,
            AttributeNames=["ApproximateNumberOfMessagesDelayed"],
        )["Attributes"]
        assert attributes == {"ApproximateNumberOfMessagesDelayed": "0"}
    finally:
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
def test_only_a_well_formed_tenant_attribute_names_the_limited_tenant(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender's `tenant` attribute may reach a log line (a message sent straight back):
    one that is not a tenant name counts as none, the worker's default tenant."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "2")
    settings = Settings.from_env()
    consumer = build(settings).consumer

    def named(value: str) -> dict[str, Any]:
        return {"MessageAttributes": {"tenant": {"DataType": "String", "StringValue": value}}}

    try:
        assert consumer._handler.limited_tenant(named("acme")) == "acme"
        for hostile in ("a b", "x" * 129, "\x1b[31mred", "tenant\nforged: line"):
            assert consumer._handler.limited_tenant(named(hostile)) == settings.tenant_id
    finally:
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
def test_a_tenants_override_gates_its_first_message_without_a_default_limit(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flooding tenant an operator limited (`agentq tenants limit`) on a fleet with no
    default limit: its very first message here is gated, so its first batch does not take
    the slots before its limit is known. One listing of every override tells, not a read
    per tenant on the receiving thread."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("TENANT_CONCURRENCY_LIMIT", "0")
    TenantLimitStore(inproc_stack.dynamodb, inproc_stack.resources.table_name).set("flood", 2)
    consumer = build(Settings.from_env()).consumer
    store = consumer._handler._preparer._limits._store
    asked: list[str] = []
    get, overrides = store.get, store.overrides

    def read(tenant: str) -> int | None:
        asked.append(tenant)
        return get(tenant)

    def listing() -> list[Any]:
        asked.append("listing")
        return overrides()

    monkeypatch.setattr(store, "get", read)
    monkeypatch.setattr(store, "overrides", listing)

    def gated(tenant: str) -> list[str | None]:
        of = {"MessageAttributes": {"tenant": {"DataType": "String", "StringValue": tenant}}}
        return [consumer._handler.limited_tenant(of) for _ in range(3)]

    try:
        assert gated("flood") == ["flood"] * 3
        assert gated("quiet") == [None] * 3 and gated("other") == [None] * 3
        assert asked == ["listing"]
    finally:
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()
