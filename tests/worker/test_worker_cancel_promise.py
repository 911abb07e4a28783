"""The cancel promise on a real worker: once the caller is told "cancel requested", no
new attempt starts, whichever way the flagged attempt ends before a heartbeat saw the
flag (a retryable failure, a drain's give-back, a surplus give-back), and a task locked
ahead of its slot never starts its child once cancelled."""

from __future__ import annotations

import json
import signal
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import new_id, queue_counts, receive_all, running_worker, send, state

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.local.workers import SAMPLE_DEFINITIONS
from agentq.states import TaskState
from worker.app import build
from worker.inflight import InFlight
from worker.settle.handler import Prepared

pytestmark = pytest.mark.timeout(180)


def _client(monkeypatch: pytest.MonkeyPatch) -> AgentqClient:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    return AgentqClient.from_env()


def _requested(client: AgentqClient, request_id: str) -> bool:
    """The caller is told its cancel is requested (an attempt holds the task)."""
    [answer] = client.cancel(request_id, tenant="acme")
    return (answer.request_id, answer.outcome, answer.state) == (
        request_id, "requested", "PROCESSING")  # fmt: skip


def _cancelled_once(events: EventLog, stack: Stack, envelope: TaskEnvelope) -> None:
    """CANCELLED for good: its `Task Cancelled` stored and sent, its message gone."""
    cancelled = events.wait(envelope.request_id, "Task Cancelled")[0]
    final = state(stack, envelope)
    assert final is not None and final.state is TaskState.CANCELLED, final
    assert final.raw["terminalEvent"]["eventId"] == cancelled["eventId"]
    wait_for(lambda: queue_counts(stack) == (0, 0), timeout=20, message="its message deleted")


def test_a_retryable_failure_after_a_cancel_request_ends_cancelled_not_retried(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client, events = _client(monkeypatch), EventLog(stack)
    go, side_log = tmp_path / "go", tmp_path / "runs.jsonl"
    # Fails retryably once, when the test says; a second attempt would complete.
    task = send(stack, "sample-fail", {"times": 1, "wait_file": str(go),
                                       "side_log": str(side_log)})  # fmt: skip
    # No heartbeat during the attempt (its lease lasts 90 s): only the end can see the flag.
    with running_worker(stack, VISIBILITY_EXTENSION_INTERVAL="30000",
                        VISIBILITY_EXTENSION_AMOUNT="60") as worker:  # fmt: skip
        events.wait(task.request_id, "Task Processing Started")
        assert _requested(client, task.request_id)
        flagged = client.get_task(task.request_id, tenant="acme")
        assert flagged.state is TaskState.PROCESSING and flagged.raw["cancelRequested"] is True
        go.touch()  # the attempt now fails retryably, its cancel not yet seen
        _cancelled_once(events, stack, task)
        worker.stop()
    assert events.types(task.request_id).count("Task Processing Started") == 1
    assert not events.of(task.request_id, "Task Processing Failed")
    assert not events.of(task.request_id, "Task Completed")
    assert len(side_log.read_text().splitlines()) == 1, "the task code ran once"
    assert state(stack, task).attempt == 1  # type: ignore[union-attr]


def test_a_prefetched_task_cancelled_then_given_back_at_drain_ends_cancelled(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, events = _client(monkeypatch), EventLog(stack)
    with running_worker(stack, MAX_CONCURRENT_CLAUDE="1", PREFETCH_HORIZON="60000",
                        WARM_CHILDREN="0", DRAIN_TIMEOUT="500") as worker:  # fmt: skip
        warm_up = send(stack, "sample-noop")
        events.wait(warm_up.request_id, "Task Completed", timeout=90)
        running, waiting = (
            TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-sleep",
                         input={"seconds": 60})
            for _ in range(2)
        )  # fmt: skip
        stack.sqs.send_message_batch(
            QueueUrl=stack.resources.queue_url,
            Entries=[{"Id": str(n), "MessageBody": e.to_body(),
                      "MessageAttributes": e.message_attributes()}
                     for n, e in enumerate((running, waiting))],
        )  # fmt: skip
        started = wait_for(
            lambda: [e for e in (running, waiting)
                     if events.of(e.request_id, "Task Processing Started")],
            timeout=60, message="one of the two started",
        )  # fmt: skip
        if started[0] is waiting:
            running, waiting = waiting, running
        wait_for(lambda: (r := state(stack, waiting)) is not None
                 and r.state is TaskState.PROCESSING, timeout=20,
                 message="the other locked ahead of its slot")  # fmt: skip
        assert _requested(client, waiting.request_id)
        assert client.get_task(waiting.request_id, tenant="acme").raw["cancelRequested"] is True
        worker.send(signal.SIGTERM)  # the drain gives the prefetched one back
        cancelled = events.wait(waiting.request_id, "Task Cancelled")[0]
        worker.wait(timeout=60)
    final = state(stack, waiting)
    assert final is not None and final.state is TaskState.CANCELLED, final
    assert final.raw["terminalEvent"]["eventId"] == cancelled["eventId"]
    assert not events.of(waiting.request_id, "Task Processing Started")
    # What is left on the queue is the running task's released message, not its.
    assert queue_counts(stack) == (1, 0)
    [left] = receive_all(stack, 1)
    assert json.loads(left["Body"])["requestId"] == running.request_id


def _in_process_prepared(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, dict[str, Any], InFlight, Prepared, TaskEnvelope]:
    """A worker built in process (real clients on the stack) holding one task locked
    ahead of a slot, as a prefetched or gated message is."""
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    consumer = build(Settings.from_env()).consumer
    envelope = send(stack, "sample-echo", {"text": "never"})
    [message] = receive_all(stack, 1)
    entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"],
                     message=message)  # fmt: skip
    consumer._inflight.add(entry)
    prepared = consumer._handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)
    return consumer, message, entry, prepared, envelope


def _close(consumer: Any) -> None:
    consumer._batcher.close()
    consumer._events.close()
    consumer._limited.shutdown()


def test_a_locked_task_cancelled_then_given_back_as_surplus_ends_cancelled(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, events = _client(monkeypatch), EventLog(stack)
    consumer, message, entry, prepared, envelope = _in_process_prepared(stack, monkeypatch)
    try:
        assert _requested(client, envelope.request_id)
        done: Future[Any] = Future()
        done.set_result(prepared)
        held = (message, entry, done)
        consumer.slots.gate(held)
        # Locked, but every slot was taken meanwhile: the intake's verdict (its own tests
        # cover when) is "surplus", and the consumer gives it back.
        monkeypatch.setattr(consumer.slots, "settle_gate", lambda *_, **__: "surplus")
        consumer._gate_decided(held)
        consumer._batcher.flush()
        _cancelled_once(events, stack, envelope)
    finally:
        _close(consumer)
    assert not events.of(envelope.request_id, "Task Processing Started")


def test_a_prefetched_task_cancelled_before_its_slot_never_starts_its_child(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after its lock and before any heartbeat saw it: when its slot comes,
    the handler must not start the child (task code would begin before the kill)."""
    client, events = _client(monkeypatch), EventLog(stack)
    consumer, message, entry, prepared, envelope = _in_process_prepared(stack, monkeypatch)
    try:
        assert _requested(client, envelope.request_id)
        verdict = consumer._handler.handle(
            message, entry=entry, prepared=prepared, on_child_exit=lambda: None
        )
        consumer._batcher.flush()
        assert verdict == "cancelled"
        _cancelled_once(events, stack, envelope)
    finally:
        _close(consumer)
    assert entry.child_pid is None, "no child was started"
    assert not events.of(envelope.request_id, "Task Processing Started")
