"""The worker's own fault paths (issue 14): refusals, give-back, prefetch, heartbeat.

Each drives the worker's real parts (worker_parts.py) against moto's server, with AWS
faults injected where a fault is the cause.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conftest import Stack
from fault_support import faulty_client, injector, rule
from support import wait_for
from worker_parts import send_and_receive, worker_parts

from agentq.envelope import TaskEnvelope
from agentq.events import task_event
from agentq.faults.config import Kind
from agentq.states import TaskState
from agentq.store.tasks import Lease, TaskStore
from worker.inflight import InFlight
from worker.settle.outcome import Outcome
from worker.settle.prepare import Prepared

pytestmark = pytest.mark.timeout(120)


def _queue_total(stack: Stack) -> int:
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def test_reject_leaves_a_task_held_elsewhere_and_its_message_alone(stack: Stack) -> None:
    """Defect 5: a worker that does not know a definition (rolling deploy) published
    `Task Failed` for a task another worker was running and deleted its message."""
    parts = worker_parts(stack)
    request_id = f"r-{uuid.uuid4().hex[:12]}"
    holder = parts.store.acquire(
        TaskEnvelope(request_id=request_id, tenant="acme", definition="deployed-later"),
        worker_id="w-new",
        lease_seconds=60,
        max_attempts=3,
    )
    _, message, entry = send_and_receive(stack, "deployed-later", request_id=request_id)
    parts.inflight.add(entry)

    verdict = parts.handler.handle(message, entry=entry)
    assert parts.batcher.flush()

    assert verdict == "held_elsewhere"
    assert parts.sink.of("Task Failed") == []
    record = parts.store.require("acme", request_id)
    assert (record.state, record.lease_token) == (TaskState.PROCESSING, holder.token)
    assert _queue_total(stack) == 1  # backed off, never deleted


def test_reject_of_a_job_task_stores_and_publishes_its_failure_with_the_job(
    stack: Stack,
) -> None:
    """Defect 5, second half: the event carried no jobId, so dependents stayed BLOCKED."""
    parts = worker_parts(stack)
    job_id = f"j{uuid.uuid4().hex[:10]}"
    envelope, message, entry = send_and_receive(stack, "deployed-later", job_id=job_id)
    parts.store.create(envelope)
    parts.inflight.add(entry)

    assert parts.handler.handle(message, entry=entry) == "rejected"

    [event] = parts.sink.of("Task Failed")
    assert event.job_id == job_id
    record = parts.store.require("acme", envelope.request_id)
    assert record.state is TaskState.FAILED
    assert record.raw["terminalEvent"]["eventId"] == event.event_id


def test_reject_of_a_finished_task_resends_its_own_ending(stack: Stack) -> None:
    parts = worker_parts(stack)
    envelope, message, entry = send_and_receive(stack, "deployed-later")
    lease = parts.store.acquire(envelope, worker_id="w-new", lease_seconds=60, max_attempts=3)
    ending = task_event("Task Completed", request_id=envelope.request_id, tenant="acme", attempt=1)
    parts.store.finalize(lease, TaskState.COMPLETED, fields={"terminalEvent": ending.to_detail()})
    parts.inflight.add(entry)

    assert parts.handler.handle(message, entry=entry) == "duplicate"

    assert [e.event_id for e in parts.sink.events] == [ending.event_id]
    assert parts.store.require("acme", envelope.request_id).state is TaskState.COMPLETED


def test_a_failed_give_back_does_not_abort_the_drain(stack: Stack) -> None:
    """Suspected: a non-LeaseLost error in `unprepare` (DynamoDB failing every retry)
    escaped and stopped the drain from giving back the other prefetched messages."""
    dynamodb = faulty_client(
        stack,
        "dynamodb",
        injector(rule("dynamodb:UpdateItem", Kind.SERVER_ERROR, match="releasedBy")),
    )
    parts = worker_parts(stack, dynamodb)
    _, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    prepared = parts.handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)

    parts.handler.unprepare(prepared)  # must not raise

    assert parts.batcher.flush()
    assert not parts.inflight.holds(entry)
    wait_for(
        lambda: stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, WaitTimeSeconds=1
        ).get("Messages"),
        timeout=20,
        message="the message visible again",
    )


def test_a_prefetched_lock_lost_before_its_start_starts_no_child(stack: Stack) -> None:
    """Suspected: a prefetched task whose lock a renewal found lost (here: cancelled
    while it waited) still emitted Task Processing Started and started its child."""
    parts = worker_parts(stack)
    envelope, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    prepared = parts.handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)
    assert parts.store.transition(
        "acme", envelope.request_id, from_states=[TaskState.PROCESSING],
        to_state=TaskState.CANCELLED,
    ) is not None  # fmt: skip
    parts.heartbeat.beat()
    assert entry.stop.reason == "lease_lost"

    assert parts.handler.handle(message, entry=entry, prepared=prepared) == "lease_lost"

    assert entry.child_pid is None
    assert parts.sink.of("Task Processing Started") == []
    assert parts.store.require("acme", envelope.request_id).state is TaskState.CANCELLED


class SlotClearsLease(InFlight):
    """An entry whose slot thread clears its lease right after the `clear_after`-th read
    of it: the child ended at that very moment (defect 8's race, made deterministic)."""

    clear_after: int = 0
    reads: int = 0

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name == "lease" and value is not None:
            reads = object.__getattribute__(self, "reads") + 1
            object.__setattr__(self, "reads", reads)
            if reads >= object.__getattribute__(self, "clear_after"):
                object.__setattr__(self, "lease", None)
        return value


@pytest.mark.parametrize("clear_after", [1, 2, 3, 4])
def test_a_lease_cleared_mid_beat_never_stops_the_other_renewals(
    stack: Stack, clear_after: int
) -> None:
    """Defect 8: the heartbeat read `entry.lease` twice; a slot clearing it in between
    made the beat raise, so no lease on the worker was renewed."""
    parts = worker_parts(stack)
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    leases: list[Lease] = []
    envelopes = [
        TaskEnvelope(
            request_id=f"h-{uuid.uuid4().hex[:12]}", tenant="acme", definition="sample-echo"
        )
        for _ in range(2)
    ]
    for envelope in envelopes:
        leases.append(store.acquire(envelope, worker_id="w1", lease_seconds=3, max_attempts=3))
    racing = SlotClearsLease(message_id="m1", receipt_handle="h1", envelope=envelopes[0],
                             lease=leases[0], extending=False)  # fmt: skip
    racing.clear_after = clear_after
    steady = InFlight(message_id="m2", receipt_handle="h2", envelope=envelopes[1],
                      lease=leases[1], extending=False)  # fmt: skip
    parts.inflight.add(racing)
    parts.inflight.add(steady)

    parts.heartbeat.beat()

    assert steady.lease is not None
    assert steady.lease.effective_until_ms > leases[1].effective_until_ms
    assert not steady.stop.is_set()


@pytest.mark.parametrize(
    ("kind", "state"),
    [
        (Kind.TRANSACTION_CONFLICT, TaskState.RETRYING),  # three conflicts, then the write
        (Kind.SERVER_ERROR, TaskState.PROCESSING),  # every try fails: the lease lapses
    ],
)
def test_a_shutdown_release_survives_its_final_write_failing(
    stack: Stack, kind: Kind, state: TaskState, tmp_path: Any
) -> None:
    """Defect 1 in `_release`: a conflict (retried now) or an error that outlasts
    botocore's retries escaped before the message was made visible again."""
    dynamodb = faulty_client(
        stack,
        "dynamodb",
        injector(
            rule(
                "dynamodb:UpdateItem",
                kind,
                match="releasedBy",
                limit=3 if kind is Kind.TRANSACTION_CONFLICT else None,
            )
        ),
    )
    parts = worker_parts(stack, dynamodb)
    envelope, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    prepared = parts.handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)

    result = parts.handler._settler.settle(
        entry, envelope, prepared.lease, tmp_path, Outcome(verdict="released"), 10, max_attempts=3
    )

    assert result == "released"
    assert parts.batcher.flush()
    assert parts.store.require("acme", envelope.request_id).state is state
    wait_for(
        lambda: stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, WaitTimeSeconds=1
        ).get("Messages"),
        timeout=20,
        message="the message visible again",
    )
