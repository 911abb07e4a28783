"""Long delays within SQS's 12-hour visibility rule, with the worker's real parts.

moto runs in-process under the local AWS rule (agentq.local.rules.sqs_visibility_cap)
on a controllable clock, shared with agentq's `now_ms`: a week passes in a few hundred
requests. The worker's monotonic clock is real: each re-delay comes right after its
receive, as in production.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import moto.sqs.models as sqs_models
import pytest
from conftest import Stack
from worker_parts import Parts, worker_parts

import agentq.events
from agentq.envelope import TaskEnvelope
from agentq.local.rules import sqs_visibility_cap
from agentq.states import TaskState
from worker.inflight import MAX_VISIBILITY_S, InFlight
from worker.settle.handler import Prepared

WEEK_S = 7 * 24 * 3600
# agentq's `now_ms` reads the shared clock as wall time plus an offset taken a moment
# apart, so it may differ from the clock by a millisecond or so.
READ_MS = 5


class SharedClock:
    """One clock for moto's SQS and for agentq's `now_ms`, standing still but for
    `advance`: how long this test's own requests take on a loaded machine is no part of
    what it measures."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self._millis = sqs_models.unix_time_millis
        self._start_ms = float(int(self._millis()))

    def millis(self, dt: Any = None) -> float:
        return float(self._millis(dt)) if dt is not None else self._start_ms + self.offset_s * 1000

    def wall_offset_ms(self) -> int:
        """What agentq's `now_ms` adds to wall time to read this clock."""
        return int(self.millis() - self._millis())

    def seconds(self, dt: Any = None) -> float:
        return self.millis(dt) / 1000

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds


@dataclass
class SentVisibility:
    """What the worker asked SQS for, per receipt handle: visibilities (and whether
    SQS took them) and the delays of fresh copies."""

    changes: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)

    def before(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "ChangeMessageVisibilityBatch":
            self.changes += [
                (e["ReceiptHandle"], e["VisibilityTimeout"]) for e in params["Entries"]
            ]
        elif model.name == "SendMessageBatch":
            self.copies += [e.get("DelaySeconds", 0) for e in params["Entries"]]

    def after(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "ChangeMessageVisibilityBatch":
            self.rejected += [f["Code"] for f in parsed.get("Failed", [])]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SharedClock:
    backend, message = sqs_models.SQSBackend, sqs_models.Message
    for name in ("change_message_visibility", "change_message_visibility_batch"):
        monkeypatch.setattr(backend, name, getattr(backend, name))
    monkeypatch.setattr(message, "mark_received", message.mark_received)
    shared = SharedClock()
    monkeypatch.setattr(sqs_models, "unix_time_millis", shared.millis)
    monkeypatch.setattr(sqs_models, "unix_time", shared.seconds)
    monkeypatch.setattr(agentq.events, "clock_offset_ms", shared.wall_offset_ms)
    sqs_visibility_cap.install()
    return shared


@pytest.fixture
def parts(inproc_stack: Stack, clock: SharedClock) -> Iterator[tuple[Parts, SentVisibility]]:
    built = worker_parts(inproc_stack)
    sent = SentVisibility()
    events = inproc_stack.sqs.meta.events
    events.register("provide-client-params.sqs.*", sent.before)
    events.register("after-call.sqs.*", sent.after)
    yield built, sent
    built.batcher.close()


def send_delayed(stack: Stack, delay_s: int) -> TaskEnvelope:
    """A task due in `delay_s`, as the client sends it: SQS holds it its 15 minutes."""
    envelope = TaskEnvelope(request_id=f"d-{uuid.uuid4().hex[:12]}", tenant="acme",
                            definition="sample-echo",
                            not_before_ms=agentq.events.now_ms() + delay_s * 1000)  # fmt: skip
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=envelope.to_body(),
                           MessageAttributes=envelope.message_attributes(),
                           DelaySeconds=900)  # fmt: skip
    return envelope


def receive(stack: Stack) -> list[dict[str, Any]]:
    return list(stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
        AttributeNames=["All"], MessageAttributeNames=["All"],
    ).get("Messages", []))  # fmt: skip


def prepare(parts: Parts, message: dict[str, Any], **fields: Any) -> Prepared | str:
    entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"],
                     message=message, **fields)  # fmt: skip
    parts.inflight.add(entry)
    verdict = parts.handler.prepare(message, entry)
    assert parts.batcher.flush()
    return verdict


@dataclass
class Waited:
    receives: int = 0
    long_waits: int = 0  # re-delays in place, each as long as SQS allows or to its time


def wait_out(stack: Stack, clock: SharedClock, parts: Parts, sent: SentVisibility,
             due_ms: int) -> Waited:  # fmt: skip
    """Receive and prepare the task's message, moving the clock to the end of each wait
    the worker asked for, until it is locked to run; checks each wait holds."""
    waited = Waited()
    rejected = len(sent.rejected)
    while True:
        [message] = receive(stack)
        waited.receives += 1
        assert waited.receives <= 40, "the delay cycles faster than SQS's 12 hours allow"
        verdict = prepare(parts, message)
        if isinstance(verdict, Prepared):
            return waited
        assert verdict == "not_ready"
        assert len(sent.rejected) == rejected
        if int(message["Attributes"]["ApproximateReceiveCount"]) == 1:
            # Re-delayed in place, as long as SQS allows for this receive (or to its time).
            handle, wait = sent.changes[-1]
            assert handle == message["ReceiptHandle"]
            left_s = (due_ms - agentq.events.now_ms()) / 1000
            assert (
                MAX_VISIBILITY_S - 600 <= wait <= MAX_VISIBILITY_S
                or left_s - READ_MS / 1000 <= wait
            )
            waited.long_waits += 1
        else:
            wait = sent.copies[-1]  # a fresh copy: its receive count starts again
            assert wait == 900
        # Hidden all along: nothing visible until its wait is over.
        clock.advance(wait - 2)
        assert receive(stack) == []
        clock.advance(3)


def test_a_weeks_delay_is_waited_out_12_hours_at_a_time(
    inproc_stack: Stack, clock: SharedClock, parts: tuple[Parts, SentVisibility]
) -> None:
    worker, sent = parts
    envelope = send_delayed(inproc_stack, WEEK_S)
    due_ms = envelope.not_before_ms or 0
    clock.advance(900)
    waited = wait_out(inproc_stack, clock, worker, sent, due_ms)
    print(f"a week's delay: {waited.receives} receives, {waited.long_waits} long waits")
    assert agentq.events.now_ms() >= due_ms - READ_MS and sent.rejected == []
    # Not late either: the last wait ends at its time, rounded up to a whole second (the
    # loop looks 1 s after each wait's end).
    assert agentq.events.now_ms() - due_ms <= 2_000 + READ_MS
    # One long wait per 12 hours: a receive of the message, and one of its fresh copy
    # (from its second receive on, a message is requeued so that waiting never spends
    # the receives maxReceiveCount allows for attempts).
    assert 14 <= waited.long_waits <= 15 and waited.receives <= 2 * waited.long_waits + 1
    record = worker.store.get(envelope.tenant, envelope.request_id)
    assert record is not None and record.state is TaskState.PROCESSING and record.attempt == 1


def test_a_re_delay_sqs_rejects_costs_one_receive_not_a_loop(
    inproc_stack: Stack, clock: SharedClock, parts: tuple[Parts, SentVisibility]
) -> None:
    """A worker frozen between SQS's receive and its own stamp of it (longer than the
    margin) asks for more than SQS allows: rejected. The message comes back at the end
    of the visibility it had, and the next re-delay is taken; the task runs once due."""
    worker, sent = parts
    envelope = send_delayed(inproc_stack, 24 * 3600)
    clock.advance(900)
    [message] = receive(inproc_stack)
    clock.advance(11 * 3600)  # frozen 11 hours after SQS handed it out
    assert prepare(worker, message) == "not_ready"
    assert sent.rejected == ["InvalidParameterValue"]
    # Its receive's visibility (the queue's, well short of 11 hours) is over: it is back
    # at once, its next re-delays are taken, and it runs once due with its first attempt.
    waited = wait_out(inproc_stack, clock, worker, sent, envelope.not_before_ms or 0)
    assert agentq.events.now_ms() >= (envelope.not_before_ms or 0) - READ_MS
    assert waited.receives <= 5 and sent.rejected == ["InvalidParameterValue"]
    record = worker.store.get(envelope.tenant, envelope.request_id)
    assert record is not None and record.attempt == 1


@pytest.mark.parametrize("refusal", ["not_ready", "held_elsewhere"])
def test_the_heartbeat_keeps_a_prepared_ahead_messages_back_off(
    inproc_stack: Stack, clock: SharedClock, parts: tuple[Parts, SentVisibility], refusal: str
) -> None:
    """A prefetched message waits in the buffer, in the in-flight registry, until a slot
    takes it; its preparation may have backed it off in place meanwhile (not yet due,
    or held by another worker). The heartbeat must leave that back-off alone: it used
    to extend the message by its few seconds, so the message came back early."""
    worker, sent = parts
    if refusal == "not_ready":
        send_delayed(inproc_stack, 3600)
        clock.advance(900)
    else:
        envelope = TaskEnvelope(request_id=f"h-{uuid.uuid4().hex[:12]}", tenant="acme",
                                definition="sample-echo")  # fmt: skip
        worker.store.acquire(envelope, worker_id="other", lease_seconds=30, max_attempts=3)
        inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url,
                                      MessageBody=envelope.to_body(),
                                      MessageAttributes=envelope.message_attributes())  # fmt: skip
    [message] = receive(inproc_stack)
    assert prepare(worker, message) == refusal
    backed_off = sent.changes[-1][1]
    assert backed_off > 30 and len(worker.inflight) == 1  # still buffered
    for _ in range(3):
        worker.heartbeat.beat()
    assert sent.changes[-1][1] == backed_off  # nothing sent for it since
    clock.advance(worker.settings.extension_amount_s + 20)
    assert receive(inproc_stack) == []


def test_the_heartbeat_never_asks_past_sqs_12_hours(
    inproc_stack: Stack, clock: SharedClock, parts: tuple[Parts, SentVisibility]
) -> None:
    """A message held (a task running) for almost 12 hours of one receive: extended only
    to the end SQS allows, then left to lapse, never asked past it."""
    worker, sent = parts
    inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url, MessageBody="{}")
    [message] = receive(inproc_stack)
    entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"])
    worker.inflight.add(entry)
    held_s = entry.visibility_room_s() - 1.5  # then a second and a half of room is left
    entry.handle_received_at -= held_s
    clock.advance(held_s)
    worker.heartbeat.beat()
    assert sent.changes[-1] == (message["ReceiptHandle"], 1) and sent.rejected == []
    entry.handle_received_at -= 1
    clock.advance(1)  # under a second left: too little for a whole second more
    count = len(sent.changes)
    worker.heartbeat.beat()
    assert len(sent.changes) == count and entry.extending is False and sent.rejected == []
