"""Parking (worker.parking) with the worker's real preparer against moto's server.

A limited tenant's message refused a seat waits in the worker instead of going round
its queue: these tests read the queue and count the store's requests to show that it
did not leave, that it took the seat the moment one freed, and what a drain does.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import Stack
from fault_support import Attempts, faulty_client, injector, rule
from support import wait_for
from worker_parts import LONG_LEASE, Parts, send_and_receive, worker_parts

from agentq.aws import AwsClients
from agentq.faults.config import FaultSpec, Kind
from agentq.states import TaskState
from agentq.store.tenants import seat_start
from worker.inflight import InFlight
from worker.parking import SeatWaits
from worker.settle.prepare import Prepared

pytestmark = pytest.mark.timeout(120)

NEVER = 600.0  # no parked message here wakes by its own timer
# The holders' seats are held by their leases, which no heartbeat renews here: fast_env's
# 3 s lapsed on a loaded host before the next message parked, which then took a lapsed
# seat instead of waiting (worker_parts.LONG_LEASE).


def _queue(stack: Stack) -> tuple[int, int]:
    """(messages in the task queue, of which delayed): a message sent back after a
    refusal is a fresh copy delayed by the back-off, its original deleted."""
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    total = sum(int(count) for count in attributes.values())
    return total, int(attributes["ApproximateNumberOfMessagesDelayed"])


def _seated(stack: Stack, parts: Parts) -> Prepared:
    """The tenant's only seat (limit 1), held by a prepared task."""
    parts.store.tenant_limits().set("acme", 1)
    _, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    holder = parts.handler.prepare(message, entry)
    assert isinstance(holder, Prepared) and holder.lease.seat is not None
    return holder


def _parked(
    stack: Stack, parts: Parts, pool: ThreadPoolExecutor, seats: SeatWaits
) -> tuple[dict[str, Any], InFlight, Future[Prepared | str]]:
    _, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    before = seats.parked
    preparation = pool.submit(parts.handler.prepare, message, entry, seats)
    wait_for(lambda: seats.parked == before + 1, timeout=30, message="the message parked")
    return message, entry, preparation


def _transactions(attempts: Attempts) -> int:
    return attempts.counts["TransactWriteItems"]


def test_a_parked_message_takes_the_seat_freed_here_and_never_leaves_the_worker(
    stack: Stack,
) -> None:
    attempts = Attempts()
    dynamodb = attempts.attach(AwsClients("eu-west-1").dynamodb)
    parts = worker_parts(stack, dynamodb, env=LONG_LEASE)
    holder = _seated(stack, parts)
    seats = SeatWaits(slots=4, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        _, entry, preparation = _parked(stack, parts, pool, seats)
        assert not preparation.done()
        parts.store.finalize(holder.lease, TaskState.COMPLETED)  # its seat comes free
        released = _transactions(attempts)
        seats.freed("acme")
        prepared = preparation.result(timeout=30)
    assert isinstance(prepared, Prepared), prepared
    assert prepared.lease.attempt == 1 and prepared.lease.seat is not None
    assert prepared.entry is entry
    # One transaction after the seat freed (the lock that took it), and the message was
    # never sent back: the queue holds the two received messages, neither delayed.
    assert _transactions(attempts) == released + 1
    assert parts.batcher.flush()
    assert _queue(stack) == (2, 0)


def test_a_tenant_parked_full_is_refused_without_a_lock_transaction(stack: Stack) -> None:
    attempts = Attempts()
    dynamodb = attempts.attach(AwsClients("eu-west-1").dynamodb)
    parts = worker_parts(stack, dynamodb, env=LONG_LEASE)
    _seated(stack, parts)
    seats = SeatWaits(slots=2, retry_s=NEVER, park_s=NEVER)  # one parked a tenant
    with ThreadPoolExecutor(1) as pool:
        _parked(stack, parts, pool, seats)
        assert seats.full("acme")
        before = _transactions(attempts)
        envelope, message, entry = send_and_receive(stack, "sample-echo")
        parts.inflight.add(entry)
        verdict = parts.handler.prepare(message, entry, seats)
        assert verdict == "tenant_limit"
        assert _transactions(attempts) == before, "a transaction that could only be refused"
        seats.close()
    # Sent back as a fresh copy, never locked (so no attempt spent).
    assert parts.batcher.flush()
    assert _queue(stack) == (3, 2)  # the third and (at the close) the parked one, fresh
    assert parts.store.get("acme", envelope.request_id) is None


def test_a_drain_sends_parked_messages_back_at_once(stack: Stack) -> None:
    parts = worker_parts(stack, env=LONG_LEASE)
    _seated(stack, parts)
    seats = SeatWaits(slots=4, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        preparation = _parked(stack, parts, pool, seats)[2]
        threading.Thread(target=seats.close).start()
        # Its back-off and park time are 600 s: only the close can end it within 30 s.
        assert preparation.result(timeout=30) == "tenant_limit"
    assert parts.batcher.flush()
    assert _queue(stack) == (2, 1)  # the parked one is a delayed fresh copy now


def test_a_tenant_refused_here_lately_parks_its_next_message_without_a_transaction(
    stack: Stack,
) -> None:
    """A refusal marks the tenant at its limit for the back-off: the next message parks
    untried, and takes the seat when it frees here (one transaction, the one that takes
    it), instead of spending a transaction and a seats query on a refusal first."""
    attempts = Attempts()
    dynamodb = attempts.attach(AwsClients("eu-west-1").dynamodb)
    parts = worker_parts(stack, dynamodb, env=LONG_LEASE)
    holder = _seated(stack, parts)
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=NEVER)  # four may park a tenant
    with ThreadPoolExecutor(2) as pool:
        first = _parked(stack, parts, pool, seats)[2]  # tried: refused, then parked
        assert seats.refused_lately("acme")
        before = _transactions(attempts), attempts.counts["Query"]
        second = _parked(stack, parts, pool, seats)[2]
        assert (_transactions(attempts), attempts.counts["Query"]) == before
        parts.store.finalize(holder.lease, TaskState.COMPLETED)  # its seat comes free
        released = _transactions(attempts)
        seats.freed("acme")
        wait_for(lambda: first.done() or second.done(), timeout=30, message="one took it")
        done = [f for f in (first, second) if f.done()]
        assert len(done) == 1 and isinstance(done[0].result(), Prepared), done
        assert _transactions(attempts) == released + 1
        seats.close()
        rest = second if done[0] is first else first
        assert rest.result(timeout=30) == "tenant_limit"  # the drain sends it back
    assert parts.batcher.flush()


def _both_seats_held(stack: Stack, parts: Parts) -> list[Prepared]:
    """The tenant's two seats (limit 2), each held by a prepared task."""
    parts.store.tenant_limits().set("acme", 2)
    holders = []
    for _ in range(2):
        _, message, entry = send_and_receive(stack, "sample-echo")
        parts.inflight.add(entry)
        holder = parts.handler.prepare(message, entry)
        assert isinstance(holder, Prepared), holder
        holders.append(holder)
    assert sorted(h.lease.seat for h in holders) == [0, 1]  # type: ignore[type-var]
    return holders


def _holder_of(holders: list[Prepared], seat: int) -> Prepared:
    [holder] = [h for h in holders if h.lease.seat == seat]
    return holder


def _other_seat(message: dict[str, Any]) -> int:
    """The seat a message's own first try would not pick (of two): freeing this one is
    what a lock that does not know which seat is free gets wrong."""
    request_id = json.loads(message["Body"])["requestId"]
    return 1 - seat_start(request_id, 2)


def test_a_parked_message_looks_before_a_timer_retry_and_takes_the_seat_it_saw_free(
    stack: Stack,
) -> None:
    """Woken by its back-off, a parked message queries its tenant's seats instead of
    spending a transaction that would be refused; a seat freed on another worker (no
    wake here) is taken with one transaction, even when it is not the seat its request
    id would try first."""
    attempts = Attempts()
    dynamodb = attempts.attach(AwsClients("eu-west-1").dynamodb)
    parts = worker_parts(stack, dynamodb, env=LONG_LEASE)
    holders = _both_seats_held(stack, parts)
    seats = SeatWaits(slots=8, retry_s=0.3, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        message, _, preparation = _parked(stack, parts, pool, seats)
        transactions, queries = _transactions(attempts), attempts.counts["Query"]
        wait_for(lambda: attempts.counts["Query"] >= queries + 3, timeout=30,
                 message="three timer retries looked at the seats")  # fmt: skip
        assert _transactions(attempts) == transactions, "a timer retry spent a transaction"
        assert not preparation.done()
        seat = _other_seat(message)
        parts.store.finalize(_holder_of(holders, seat).lease, TaskState.COMPLETED)
        released = _transactions(attempts)  # freed elsewhere: nothing wakes it here
        prepared = preparation.result(timeout=30)
    assert isinstance(prepared, Prepared), prepared
    assert prepared.lease.seat == seat
    assert _transactions(attempts) == released + 1


def test_a_parked_message_woken_by_a_seat_freed_here_takes_that_seat(stack: Stack) -> None:
    attempts = Attempts()
    dynamodb = attempts.attach(AwsClients("eu-west-1").dynamodb)
    parts = worker_parts(stack, dynamodb, env=LONG_LEASE)
    holders = _both_seats_held(stack, parts)
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        message, _, preparation = _parked(stack, parts, pool, seats)
        seat = _other_seat(message)
        parts.store.finalize(_holder_of(holders, seat).lease, TaskState.COMPLETED)
        before = _transactions(attempts), attempts.counts["Query"]
        seats.freed("acme", seat)
        prepared = preparation.result(timeout=30)
    assert isinstance(prepared, Prepared), prepared
    assert prepared.lease.seat == seat
    # The lock that took it, no refusal on the other seat and no query to find this one.
    assert (_transactions(attempts), attempts.counts["Query"]) == (before[0] + 1, before[1])


def test_a_failed_look_at_the_seats_leaves_the_decision_to_the_lock(stack: Stack) -> None:
    """The look is a saving, not a gate: when the seats query fails (a server error on
    every attempt), the parked message tries the lock as it would have without it."""
    faults = injector()
    parts = worker_parts(stack, faulty_client(stack, "dynamodb", faults), env=LONG_LEASE)
    holders = _both_seats_held(stack, parts)
    seats = SeatWaits(slots=8, retry_s=0.3, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        message, _, preparation = _parked(stack, parts, pool, seats)
        # The seat its own first try picks: the lock needs no query of its own to take it.
        seat = 1 - _other_seat(message)
        faults.spec = FaultSpec(rules=(rule("dynamodb:Query", Kind.SERVER_ERROR),))
        parts.store.finalize(_holder_of(holders, seat).lease, TaskState.COMPLETED)
        prepared = preparation.result(timeout=60)
    assert isinstance(prepared, Prepared), prepared
    assert prepared.lease.seat == seat
    assert faults.counts().get("dynamodb:Query:server_error", 0) >= 1
