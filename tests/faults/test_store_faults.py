"""The STATE item's writes under AWS faults: applied-then-retried and conflicting writes.

Regressions of issue 14: defect 1 (a transaction conflict threw a finished attempt's
result away), defect 6 (an acquire retried after it was applied reported the worker's
own lease as held elsewhere) and the redrive reset retried after it was applied.
"""

from __future__ import annotations

import uuid

import pytest
from conftest import Stack
from fault_support import faulty_client, injector, rule

from agentq.envelope import TaskEnvelope
from agentq.errors import LeaseLost
from agentq.faults.config import Kind
from agentq.states import TaskState
from agentq.store.tasks import TaskStore


def _envelope() -> TaskEnvelope:
    return TaskEnvelope(
        request_id=f"f-{uuid.uuid4().hex[:12]}", tenant="acme", definition="sample-echo", input={}
    )


def _stores(stack: Stack, *rules: object) -> tuple[TaskStore, TaskStore]:
    """(a store whose calls meet the faults, a clean one to look with)."""
    faults = injector(*rules)  # type: ignore[arg-type]
    faulty = TaskStore(faulty_client(stack, "dynamodb", faults), stack.resources.table_name)
    return faulty, TaskStore(stack.dynamodb, stack.resources.table_name)


def test_acquire_retried_after_it_was_applied_holds_its_own_lease(stack: Stack) -> None:
    """Defect 6: the retry met the new lease and reported TaskHeldElsewhere(owner=self)."""
    envelope = _envelope()
    faulty, clean = _stores(
        stack,
        rule("dynamodb:UpdateItem", Kind.APPLIED_THEN_FAILED, limit=1, match=envelope.request_id),
    )
    clean.create(envelope)
    lease = faulty.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=1)
    record = clean.require(envelope.tenant, envelope.request_id)
    assert (record.state, record.attempt, record.lease_token) == (
        TaskState.PROCESSING,
        1,
        lease.token,
    )
    assert lease.attempt == 1


def test_acquire_retried_after_its_own_lease_lapsed_takes_no_second_attempt(
    stack: Stack,
) -> None:
    """botocore's retry of an applied lock may arrive after the lease that lock wrote has
    run out (a 1 ms lease makes every retry late). It must not meet the lock's condition
    (PROCESSING with a lapsed lease) and take the task again, counting an attempt that
    never ran: it carries the first try's `:now`, before that lease's end, so it is
    refused and recognised as ours by its token."""
    envelope = _envelope()
    faulty, clean = _stores(
        stack,
        rule("dynamodb:UpdateItem", Kind.APPLIED_THEN_FAILED, limit=1, match=envelope.request_id),
    )
    clean.create(envelope)
    lease = faulty.acquire(envelope, worker_id="w1", lease_seconds=0.001, max_attempts=3)
    record = clean.require(envelope.tenant, envelope.request_id)
    assert (record.attempt, record.lease_token, lease.attempt) == (1, lease.token, 1)
    # Another worker's takeover of the lapsed lease is still a new attempt.
    other = clean.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3)
    assert other.attempt == 2


@pytest.mark.parametrize("kind", [Kind.TRANSACTION_CONFLICT, Kind.APPLIED_THEN_FAILED])
def test_finalize_keeps_a_finished_outcome_through_conflicts_and_retries(
    stack: Stack, kind: Kind
) -> None:
    """Defect 1: TransactionConflictException (not retried by botocore) escaped finalize,
    and a finalize retried after it was applied raised LeaseLost: either way the
    completed attempt's result was thrown away."""
    envelope = _envelope()
    faulty, clean = _stores(stack, rule("dynamodb:UpdateItem", kind, limit=2, match="finishedAt"))
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    record = faulty.finalize(lease, TaskState.COMPLETED, fields={"result": {"key": "k"}})
    assert record.state is TaskState.COMPLETED
    stored = clean.require(envelope.tenant, envelope.request_id)
    assert stored.state is TaskState.COMPLETED and stored.raw["result"] == {"key": "k"}


def test_finalize_of_a_lost_lease_is_still_refused(stack: Stack) -> None:
    """The mark must not let a stale holder through: another attempt's token is not ours."""
    envelope = _envelope()
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    stale = store.acquire(envelope, worker_id="w1", lease_seconds=0.001, max_attempts=3)
    fresh = store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3)
    store.finalize(fresh, TaskState.COMPLETED)
    with pytest.raises(LeaseLost):
        store.finalize(stale, TaskState.FAILED)
    assert store.require(envelope.tenant, envelope.request_id).state is TaskState.COMPLETED


def test_renewal_meets_a_transaction_conflict_and_still_renews(stack: Stack) -> None:
    envelope = _envelope()
    faulty, clean = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT, limit=1),
        rule("dynamodb:UpdateItem", Kind.TRANSACTION_CONFLICT, limit=1),
    )
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    renewed, lost = faulty.renew_many([lease], lease_seconds=60)
    assert [r.token for r in renewed] == [lease.token] and not lost


def test_one_unrenewable_lease_does_not_stop_the_others(stack: Stack) -> None:
    unlucky, lucky = _envelope(), _envelope()
    faulty, clean = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT, limit=1),
        rule("dynamodb:UpdateItem", Kind.SERVER_ERROR, match=unlucky.request_id),
    )
    leases = [
        clean.acquire(e, worker_id="w1", lease_seconds=30, max_attempts=3) for e in (unlucky, lucky)
    ]
    renewed, lost = faulty.renew_many(leases, lease_seconds=60)
    assert [r.request_id for r in renewed] == [lucky.request_id] and not lost


def test_redrive_reset_retried_after_it_was_applied_reports_the_reset(stack: Stack) -> None:
    """Suspected defect: the retry found the task PENDING already and said 'live lease,
    skipped', so the redrive sent no message."""
    envelope = _envelope()
    faulty, clean = _stores(
        stack,
        rule("dynamodb:UpdateItem", Kind.APPLIED_THEN_FAILED, limit=1, match="redrivenAt"),
    )
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=1)
    clean.finalize(lease, TaskState.FAILED)
    reset = faulty.reset_for_redrive(envelope.tenant, envelope.request_id)
    assert reset is not None and reset.state is TaskState.PENDING and reset.attempt == 0


def test_create_retried_after_it_was_applied_reports_the_creation(stack: Stack) -> None:
    envelope = _envelope()
    faulty, _ = _stores(
        stack,
        rule("dynamodb:PutItem", Kind.APPLIED_THEN_FAILED, limit=1, match=envelope.request_id),
    )
    record, created = faulty.create(envelope)
    assert created and record.state is TaskState.PENDING
