"""The conditional lock on the STATE item, against moto's server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from conftest import Stack

from agentq.aws import AwsClients
from agentq.envelope import TaskEnvelope
from agentq.errors import (
    AttemptsExhausted,
    LeaseLost,
    LockNotAcquired,
    TaskAlreadyTerminal,
    TaskHeldElsewhere,
    TaskNotReady,
)
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import Lease, TaskStore


def _envelope(request_id: str = "race-1", job_id: str | None = None) -> TaskEnvelope:
    return TaskEnvelope(request_id=request_id, tenant="acme", definition="echo", job_id=job_id)


def _store(stack: Stack) -> TaskStore:
    return TaskStore(stack.dynamodb, stack.resources.table_name)


def test_twenty_threads_race_exactly_one_wins(stack: Stack) -> None:
    envelope = _envelope()
    _store(stack).create(envelope)
    barrier = threading.Barrier(20)
    wins: list[Lease] = []
    losses: list[LockNotAcquired] = []
    lock = threading.Lock()

    def contend(index: int) -> None:
        # Each contender has its own client, as separate workers would.
        store = TaskStore(AwsClients("eu-west-1").dynamodb, stack.resources.table_name)
        barrier.wait()
        try:
            lease = store.acquire(envelope, worker_id=f"w{index}", lease_seconds=60,
                                  max_attempts=3)  # fmt: skip
        except LockNotAcquired as refused:
            with lock:
                losses.append(refused)
        else:
            with lock:
                wins.append(lease)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(wins) == 1
    assert len(losses) == 19
    # Every loser learns why: a live lock held by the winner.
    assert all(isinstance(loss, TaskHeldElsewhere) for loss in losses)
    assert {loss.owner for loss in losses if isinstance(loss, TaskHeldElsewhere)} == {
        wins[0].worker_id
    }
    record = _store(stack).require("acme", envelope.request_id)
    assert (record.state, record.attempt, record.owner) == (
        TaskState.PROCESSING, 1, wins[0].worker_id,
    )  # fmt: skip


def test_expired_lease_is_taken_over_and_old_holder_is_fenced(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("takeover-1")
    old = store.acquire(envelope, worker_id="old", lease_seconds=30, max_attempts=3)
    with pytest.raises(TaskHeldElsewhere):
        store.acquire(envelope, worker_id="new", lease_seconds=30, max_attempts=3)
    # The old holder's last heartbeat leaves it a short lease: it goes quiet now. (A short
    # lease from the start would race the refusal above on a loaded machine.)
    old = store.renew(old, lease_seconds=0.05)
    deadline = time.monotonic() + 5
    new: Lease | None = None
    while new is None and time.monotonic() < deadline:
        try:
            new = store.acquire(envelope, worker_id="new", lease_seconds=30, max_attempts=3)
        except TaskHeldElsewhere:
            time.sleep(0.05)
    assert new is not None and new.attempt == 2
    with pytest.raises(LeaseLost):
        store.renew(old, lease_seconds=30)
    with pytest.raises(LeaseLost):
        store.finalize(old, TaskState.COMPLETED)
    renewed = store.renew(new, lease_seconds=30)
    assert renewed.effective_until_ms >= new.effective_until_ms
    record = store.finalize(new, TaskState.COMPLETED, fields={"result": {"ok": True}})
    assert record.state is TaskState.COMPLETED
    assert record.effective_until_ms is None  # terminal states never expire
    assert record.raw["result"] == {"ok": True}


def test_a_lapsed_lease_no_one_took_over_is_still_its_holders(stack: Stack) -> None:
    """A heartbeat late past the lease's end renews it, alone or in a heartbeat's batch,
    while no other worker took the task: the taker's lock would have changed the token
    (test_expired_lease_is_taken_over_and_old_holder_is_fenced). A late beat under load
    costs no attempt."""
    store = _store(stack)
    leases = [
        store.acquire(_envelope(f"lapsed-{n}"), worker_id="old", lease_seconds=30, max_attempts=1)
        for n in range(2)
    ]
    leases = [store.renew(lease, lease_seconds=0.05) for lease in leases]
    deadline = time.monotonic() + 5
    while now_ms() <= max(lease.effective_until_ms for lease in leases):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    renewed = store.renew(leases[0], lease_seconds=30)
    assert renewed.effective_until_ms > now_ms()
    renewals = store.renew_leases([leases[1]], lease_seconds=30)
    assert [lease.request_id for lease in renewals.renewed] == ["lapsed-1"]
    assert renewals.lost == []
    for lease in (renewed, renewals.renewed[0]):
        with pytest.raises(TaskHeldElsewhere):
            store.acquire(_envelope(lease.request_id), worker_id="new", lease_seconds=30,
                          max_attempts=1)  # fmt: skip
        assert store.finalize(lease, TaskState.COMPLETED).attempt == 1


def test_terminal_task_cannot_be_locked_again(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("done-1")
    lease = store.acquire(envelope, worker_id="a", lease_seconds=30, max_attempts=3)
    store.finalize(lease, TaskState.FAILED)
    with pytest.raises(TaskAlreadyTerminal) as caught:
        store.acquire(envelope, worker_id="b", lease_seconds=30, max_attempts=3)
    assert caught.value.state == "FAILED"


def test_retrying_counts_attempts_until_exhausted(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("retry-1")
    for attempt in (1, 2):
        lease = store.acquire(envelope, worker_id="a", lease_seconds=30, max_attempts=2)
        assert lease.attempt == attempt
        record = store.finalize(lease, TaskState.RETRYING, retry_at_ms=0)
        assert record.state is TaskState.RETRYING
    with pytest.raises(AttemptsExhausted) as caught:
        store.acquire(envelope, worker_id="a", lease_seconds=30, max_attempts=2)
    assert caught.value.attempts == 2


def test_blocked_task_is_not_ready(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("blocked-1", job_id="job1")
    store.create(envelope, state=TaskState.BLOCKED)
    with pytest.raises(TaskNotReady):
        store.acquire(envelope, worker_id="a", lease_seconds=30, max_attempts=3)
    moved = store.transition("acme", "blocked-1", from_states=[TaskState.BLOCKED],
                             to_state=TaskState.PENDING)  # fmt: skip
    assert moved is not None and moved.state is TaskState.PENDING
    # The same transition again is refused: exactly-once enqueue for the dispatcher.
    assert store.transition("acme", "blocked-1", from_states=[TaskState.BLOCKED],
                            to_state=TaskState.PENDING) is None  # fmt: skip
    assert store.acquire(envelope, worker_id="a", lease_seconds=30, max_attempts=3).attempt == 1


def test_create_is_idempotent(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("idem-1")
    first, created = store.create(envelope, idempotency_key="k1")
    again, created_again = store.create(envelope, idempotency_key="k1")
    assert created and not created_again
    assert again.created_at_ms == first.created_at_ms


def test_transition_unless_lease_live_leaves_a_held_task(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope("dlq-1")
    store.acquire(envelope, worker_id="a", lease_seconds=60, max_attempts=3)
    kwargs: dict[str, Any] = {"from_states": [TaskState.PROCESSING, TaskState.PENDING],
                              "to_state": TaskState.FAILED, "unless_lease_live": True}  # fmt: skip
    assert store.transition("acme", "dlq-1", **kwargs) is None
    assert store.require("acme", "dlq-1").state is TaskState.PROCESSING
