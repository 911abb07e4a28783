"""Tenant seats under AWS faults: the seated lock, its renewal and its finalize applied
and retried by botocore, meeting a heartbeat's transaction, throttled."""

from __future__ import annotations

import uuid

import pytest
from conftest import Stack
from fault_support import Attempts, faulty_client, injector, rule
from support import settle_indexes

from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.faults.config import FaultRule, Kind
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from agentq.store.tenants import LIMIT_RETRY_S, CachedTenantLimits


def _envelope() -> TaskEnvelope:
    return TaskEnvelope(
        request_id=f"s-{uuid.uuid4().hex[:12]}", tenant="seated", definition="sample-echo"
    )


def _stores(stack: Stack, *rules: FaultRule) -> tuple[TaskStore, TaskStore, Attempts]:
    """(a store whose calls meet the faults, a clean one to look with, its attempts)."""
    attempts = Attempts()
    client = attempts.attach(faulty_client(stack, "dynamodb", injector(*rules)))
    faulty = TaskStore(client, stack.resources.table_name)
    return faulty, TaskStore(stack.dynamodb, stack.resources.table_name), attempts


def _holders(store: TaskStore) -> list[str]:
    return sorted(s.holder or "" for s in store.tenant_limits().seats("seated") if s.live(now_ms()))


def test_a_seated_acquire_applied_then_retried_holds_its_own_lock_and_one_seat(
    stack: Stack,
) -> None:
    envelope = _envelope()
    faulty, clean, attempts = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.APPLIED_THEN_FAILED, limit=1,
             match=envelope.request_id),
    )  # fmt: skip
    clean.create(envelope)
    lease = faulty.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3,
                           tenant_limit=2)  # fmt: skip
    assert attempts.counts["TransactWriteItems"] >= 2, "the applied write was retried"
    record = clean.require(envelope.tenant, envelope.request_id)
    assert (record.state, record.attempt, record.lease_token) == (
        TaskState.PROCESSING, 1, lease.token)  # fmt: skip
    assert lease.attempt == 1 and lease.seat is not None
    assert _holders(clean) == [lease.token], "one seat, held by this lease"
    # The other seat is still free for the tenant's next task.
    other = clean.acquire(_envelope(), worker_id="w2", lease_seconds=30, max_attempts=3,
                          tenant_limit=2)  # fmt: skip
    assert other.seat != lease.seat


def test_a_seated_acquire_meeting_a_heartbeats_transaction_is_sent_again(stack: Stack) -> None:
    envelope = _envelope()
    faulty, clean, attempts = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT, limit=2,
             match=envelope.request_id),
    )  # fmt: skip
    lease = faulty.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3,
                           tenant_limit=1)  # fmt: skip
    assert attempts.counts["TransactWriteItems"] == 3
    assert lease.attempt == 1 and _holders(clean) == [lease.token]


def test_a_heartbeat_meeting_a_conflict_still_renews_task_and_seat(stack: Stack) -> None:
    faulty, clean, _ = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT, limit=2,
             match="leaseUntil"),
    )  # fmt: skip
    seated = clean.acquire(_envelope(), worker_id="w1", lease_seconds=5, max_attempts=3,
                           tenant_limit=2)  # fmt: skip
    plain = clean.acquire(_envelope(), worker_id="w1", lease_seconds=5, max_attempts=3)
    renewals = faulty.renew_leases([seated, plain], lease_seconds=60)
    assert {lease.token for lease in renewals.renewed} == {seated.token, plain.token}
    assert not renewals.lost and not renewals.cancelled
    seat = next(s for s in clean.tenant_limits().seats("seated") if s.holder == seated.token)
    assert seat.lease_until_ms >= now_ms() + 50_000


def test_a_seated_renewal_applied_then_retried_is_still_renewed(stack: Stack) -> None:
    faulty, clean, _ = _stores(
        stack, rule("dynamodb:TransactWriteItems", Kind.APPLIED_THEN_FAILED, limit=1)
    )
    seated = clean.acquire(_envelope(), worker_id="w1", lease_seconds=5, max_attempts=3,
                           tenant_limit=1)  # fmt: skip
    renewals = faulty.renew_leases([seated], lease_seconds=60)
    assert [lease.token for lease in renewals.renewed] == [seated.token]


@pytest.mark.parametrize("end", ["finalize", "end_attempt"])
def test_a_seated_end_applied_then_retried_settles_once_and_frees_the_seat(
    stack: Stack, end: str
) -> None:
    """botocore retries the applied transaction and it still settles once. The worker
    ends attempts with `end_attempt`, which reads nothing back; `finalize` (for the
    other callers) reads the record back after a transaction that returned none."""
    envelope = _envelope()
    faulty, clean, attempts = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.APPLIED_THEN_FAILED, limit=1,
             match="finishedAt"),
    )  # fmt: skip
    ending = getattr(faulty, end)
    reads = 1 if end == "finalize" else 0
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3,
                          tenant_limit=1)  # fmt: skip
    returned = ending(lease, TaskState.COMPLETED, fields={"result": {"key": "k"}})
    assert attempts.counts["TransactWriteItems"] == 2  # applied, then botocore's retry
    # The retry carries the first try's ClientRequestToken: answered with success and
    # not applied again, as DynamoDB does, so the ending reads what it always reads.
    assert attempts.counts["GetItem"] == reads
    record = clean.require(envelope.tenant, envelope.request_id)
    assert record.state is TaskState.COMPLETED and record.raw["result"] == {"key": "k"}
    if end == "finalize":
        assert returned.state is TaskState.COMPLETED and returned.raw["result"] == {"key": "k"}
    assert _holders(clean) == []
    # Without a fault (the rule fired once): one transaction, and the same reads.
    lease = clean.acquire(_envelope(), worker_id="w1", lease_seconds=30, max_attempts=3,
                          tenant_limit=1)  # fmt: skip
    ending(lease, TaskState.FAILED)
    assert (attempts.counts["TransactWriteItems"], attempts.counts["GetItem"]) == (3, 2 * reads)


def test_a_seated_finalize_meeting_a_conflict_keeps_the_outcome(stack: Stack) -> None:
    envelope = _envelope()
    faulty, clean, _ = _stores(
        stack,
        rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT, limit=3,
             match="finishedAt"),
    )  # fmt: skip
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3,
                          tenant_limit=1)  # fmt: skip
    assert faulty.finalize(lease, TaskState.FAILED).state is TaskState.FAILED
    assert _holders(clean) == []


def test_throttled_seat_queries_and_limit_reads_are_ridden_out(stack: Stack) -> None:
    """botocore retries a throttled seat query and a throttled override read (a read that
    fails past its retries falls back: tests/functional/test_tenant_limits.py)."""
    faulty, clean, attempts = _stores(
        stack,
        rule("dynamodb:Query", Kind.THROTTLE, limit=2),
        rule("dynamodb:GetItem", Kind.THROTTLE, limit=1, match="LIMITS"),
    )
    holder = clean.acquire(_envelope(), worker_id="w1", lease_seconds=30, max_attempts=3,
                           tenant_limit=2)  # fmt: skip
    # Whichever seat the next task tries first, the one taken makes it query.
    for _ in range(8):
        lease = faulty.acquire(_envelope(), worker_id="w2", lease_seconds=30, max_attempts=3,
                               tenant_limit=2)  # fmt: skip
        if attempts.counts["Query"]:
            break
        faulty.finalize(lease, TaskState.COMPLETED)
    assert attempts.counts["Query"] == 3, "throttled twice, then answered"
    assert lease.seat is not None and lease.seat != holder.seat
    clean.tenant_limits().set("seated", 5)
    assert CachedTenantLimits(faulty.tenant_limits(), default=7).limit("seated") == 5
    assert attempts.counts["GetItem"] >= 2


def test_the_listing_of_limits_throttled_gives_no_guess_and_is_not_asked_again_at_once(
    stack: Stack,
) -> None:
    """The worker's guess of a tenant it has not read (worker.settle.prepare, `limited_tenant`)
    lists every override: throttled once, botocore's retry answers; throttled past every
    retry, there is no guess (the message is gated and its lock reads the limit), and the
    listing is not asked again for `LIMIT_RETRY_S`."""
    TaskStore(stack.dynamodb, stack.resources.table_name).tenant_limits().set("seated", 3)
    settle_indexes(stack)  # the worker's guess lists the limits through an index
    once, _, once_attempts = _stores(stack, rule("dynamodb:Query", Kind.THROTTLE, limit=1))
    assert CachedTenantLimits(once.tenant_limits(), default=0).guess("seated") == 3
    assert once_attempts.counts["Query"] == 2, "throttled, then answered"

    clock = [0.0]
    always, _, attempts = _stores(stack, rule("dynamodb:Query", Kind.THROTTLE))
    cache = CachedTenantLimits(always.tenant_limits(), default=0, clock=lambda: clock[0])
    assert cache.guess("seated") is None and cache.guess("other") is None
    tried = attempts.counts["Query"]
    assert tried >= 2, "botocore retried before giving up"
    clock[0] = LIMIT_RETRY_S - 0.1
    assert cache.guess("seated") is None and attempts.counts["Query"] == tried
    clock[0] = LIMIT_RETRY_S + 0.1
    assert cache.guess("seated") is None and attempts.counts["Query"] > tried, "asked again"
