"""A task waiting for its tenant's seat is never counted lost by the reconciler.

Its due time stays where it was while its message waits in a worker (parked) or goes
round its queue (sent back); the worker's mark (`waitSeenAt`, agentq.store.waiting) is
what tells the reconciler its message lives. The worker's real preparer against moto's
server; the reconciler's bound is a second, passed for real.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Stack
from fault_support import faulty_client, injector, rule
from support import wait_for
from worker_parts import Parts, send_and_receive, worker_parts

from agentq.aws import CallCounter
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.faults.config import FaultSpec, Kind
from agentq.reconcile import Reconciler
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from agentq.store.waiting import WAIT_SEEN_AT, WaitMarks
from worker.inflight import InFlight
from worker.parking import SeatWaits
from worker.receive.tenant_gate import LimitedTenants
from worker.settle.prepare import Prepared

pytestmark = pytest.mark.timeout(120)

NEVER = 600.0


def _reconciler(stack: Stack) -> Reconciler:
    client = AgentqClient.from_env()
    settings = Settings.from_env().model_copy(update={"reconcile_lost_after_s": 1})
    return Reconciler(settings=settings, tasks=client.tasks, jobs=client.jobs,
                      dispatcher=client.dispatcher, publisher=client.publisher,
                      dynamodb=stack.dynamodb, sqs=stack.sqs)  # fmt: skip


def _created_longer_ago_than_the_bound() -> int:
    """Let real time pass the reconciler's bound (1 s) since the task was created; the
    moment after it, `t0`. A reconciler run as of `t0 + 900` counts the task as lost
    by its due time (created before `t0 - 1000 < t0 - 100`), and as seen waiting if a
    worker marked it at `t0` or later: a run as of a fixed moment, however slowly the
    test goes on."""
    until = now_ms() + 1200
    wait_for(lambda: now_ms() > until, timeout=15, message="the bound to pass")
    return now_ms()


def _seated(stack: Stack, parts: Parts) -> Prepared:
    """The tenant's only seat (limit 1), held by a prepared task."""
    parts.store.tenant_limits().set("acme", 1)
    _, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)
    holder = parts.handler.prepare(message, entry)
    assert isinstance(holder, Prepared) and holder.lease.seat is not None
    return holder


def _waiting_task(stack: Stack, parts: Parts) -> tuple[TaskEnvelope, dict[str, object], InFlight]:
    """A submitted task of the limited tenant (its STATE item and its message), received."""
    envelope, message, entry = send_and_receive(stack, "sample-echo")
    parts.store.create(envelope)
    parts.inflight.add(entry)
    return envelope, message, entry


def test_a_parked_task_older_than_the_bound_gets_no_duplicate(stack: Stack) -> None:
    parts = worker_parts(stack)
    _seated(stack, parts)
    envelope, message, entry = _waiting_task(stack, parts)
    t0 = _created_longer_ago_than_the_bound()
    seats = SeatWaits(slots=4, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(1) as pool:
        preparation = pool.submit(parts.handler.prepare, message, entry, seats)
        wait_for(lambda: seats.parked == 1, timeout=30, message="the message parked")

        report = _reconciler(stack).run(at_ms=t0 + 900)

        seats.close()
        assert preparation.result(timeout=30) == "tenant_limit"
    assert envelope.request_id not in [r.subject for r in report.repairs], "re-sent"
    record = parts.store.require("acme", envelope.request_id)
    assert record.state is TaskState.PENDING and "repairedAt" not in record.raw


def test_a_task_parked_longer_than_the_bound_is_marked_again_at_its_wakes(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's bound of 1 s: it marks a waiting task again after 0.25 s at most.
    monkeypatch.setenv("RECONCILE_LOST_AFTER", "1")
    parts = worker_parts(stack)
    # The seat's holder keeps it for the whole test (a prepared task's 3 s lease could
    # lapse on a loaded machine, and the parked task would take the seat).
    parts.store.tenant_limits().set("acme", 1)
    holder, _, _ = send_and_receive(stack, "sample-echo")
    seated = parts.store.acquire(holder, worker_id="holder", lease_seconds=NEVER,
                                 max_attempts=3, tenant_limit=1)  # fmt: skip
    assert seated.seat is not None
    envelope, message, entry = _waiting_task(stack, parts)
    seats = SeatWaits(slots=4, retry_s=0.3, park_s=NEVER)  # wakes, looks, parks on

    def mark() -> int | None:
        seen = parts.store.require("acme", envelope.request_id).raw.get(WAIT_SEEN_AT)
        return seen if isinstance(seen, int) else None

    with ThreadPoolExecutor(1) as pool:
        preparation = pool.submit(parts.handler.prepare, message, entry, seats)
        try:
            wait_for(lambda: mark() is not None, timeout=30, message="the park's first mark")
            first = mark() or 0
            # Parked for longer than the bound since its first mark, still marked lately.
            wait_for(lambda: (mark() or 0) > first + 1200, timeout=30,
                     message="a mark newer than the bound, written while it stays parked")  # fmt: skip
            latest = mark() or 0
            report = _reconciler(stack).run(at_ms=latest + 900)
            # Still parked: its preparation has not returned. (`seats.parked` dips to 0
            # at each wake while the task looks at the seats, so it is no witness.)
            assert not preparation.done()
        finally:
            seats.close()
        assert preparation.result(timeout=30) == "tenant_limit"
    assert envelope.request_id not in [r.subject for r in report.repairs], "re-sent"


def test_a_task_sent_back_for_its_limit_is_not_lost_until_no_worker_sees_it(
    stack: Stack,
) -> None:
    parts = worker_parts(stack)
    _seated(stack, parts)
    envelope, message, entry = _waiting_task(stack, parts)
    t0 = _created_longer_ago_than_the_bound()
    seats = SeatWaits(slots=4, retry_s=NEVER, park_s=0)  # no parking: straight back

    assert parts.handler.prepare(message, entry, seats) == "tenant_limit"
    sent_back = now_ms()
    waiting = _reconciler(stack).run(at_ms=t0 + 900)
    # Then its message is lost for real: no worker sees it for longer than the bound.
    lost = _reconciler(stack).run(at_ms=sent_back + 1100)

    assert envelope.request_id not in [r.subject for r in waiting.repairs], "re-sent"
    assert envelope.request_id in [r.subject for r in lost.repairs]


def test_a_message_of_a_tenant_parked_full_is_marked_as_it_goes_back(stack: Stack) -> None:
    parts = worker_parts(stack)
    envelope, message, _ = _waiting_task(stack, parts)
    limited = LimitedTenants(parts.settings, SeatWaits(slots=4, retry_s=NEVER, park_s=0),
                             waits_for_seat=lambda _: True,
                             waiting=parts.handler.waiting)  # fmt: skip
    before = now_ms()

    limited.waiting(message)  # the consumer's send-back marks it so
    limited.shutdown()  # the mark is written on the gate pool: wait for it

    seen = parts.store.require("acme", envelope.request_id).raw.get(WAIT_SEEN_AT)
    assert isinstance(seen, int) and seen >= before


def test_a_worker_marks_a_task_once_an_interval_and_never_a_task_that_moved_on(
    stack: Stack,
) -> None:
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    calls = CallCounter()
    clock = [0.0]
    marks = WaitMarks(calls.attach(stack.aws_clients().dynamodb), stack.resources.table_name,
                      every_s=60, clock=lambda: clock[0])  # fmt: skip
    envelope = TaskEnvelope(request_id="marked-once", tenant="acme", definition="sample-echo")
    store.create(envelope)

    for _ in range(3):
        marks.mark("acme", envelope.request_id)
    clock[0] = 61.0
    marks.mark("acme", envelope.request_id)
    assert calls.snapshot() == {"dynamodb:UpdateItem": 2}

    marks.mark("acme", "never-submitted")  # no STATE item: none is created
    assert store.get("acme", "never-submitted") is None
    lease = store.acquire(envelope, worker_id="w1", lease_seconds=60, max_attempts=3)
    store.finalize(lease, TaskState.COMPLETED)
    clock[0] = 200.0
    marks.mark("acme", envelope.request_id)  # finished: the condition refuses it
    assert store.require("acme", envelope.request_id).raw[WAIT_SEEN_AT] < now_ms()


def test_a_mark_that_fails_is_only_logged_and_tried_again_at_the_next_turn(
    stack: Stack,
) -> None:
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    envelope = TaskEnvelope(request_id="mark-throttled", tenant="acme", definition="sample-echo")
    store.create(envelope)
    faults = injector()
    faults.spec = FaultSpec(rules=(rule("dynamodb:UpdateItem", Kind.THROTTLE),))
    marks = WaitMarks(faulty_client(stack, "dynamodb", faults), stack.resources.table_name,
                      every_s=60)  # fmt: skip

    marks.mark("acme", envelope.request_id)  # botocore's retries all throttled: no raise
    assert WAIT_SEEN_AT not in store.require("acme", envelope.request_id).raw
    faults.spec = FaultSpec(rules=())
    marks.mark("acme", envelope.request_id)  # not counted as marked: written now
    assert WAIT_SEEN_AT in store.require("acme", envelope.request_id).raw
