"""Per-tenant concurrency limits in the store: seats taken with the lock, renewed with
the lease, freed by the write that ends it, and free again once a lease lapses."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from conftest import Stack
from support import settle_indexes, wait_for

from agentq.aws import AwsClients
from agentq.envelope import TaskEnvelope
from agentq.errors import AttemptsExhausted, LockNotAcquired, TaskHeldElsewhere, TenantAtLimit
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import Lease, TaskStore
from agentq.store.tenants import (
    CachedTenantLimits,
    TenantLimit,
    TenantLimitStore,
    TenantSettings,
)


def _envelope(tenant: str = "busy") -> TaskEnvelope:
    return TaskEnvelope(request_id=f"t-{uuid.uuid4().hex[:12]}", tenant=tenant, definition="echo")


def _store(stack: Stack) -> TaskStore:
    return TaskStore(stack.dynamodb, stack.resources.table_name)


def _take(store: TaskStore, envelope: TaskEnvelope, limit: int = 2, **extra: Any) -> Lease:
    options: dict[str, Any] = {"lease_seconds": 30, "max_attempts": 3, **extra}
    return store.acquire(envelope, worker_id="w1", tenant_limit=limit, **options)


def _live_holders(stack: Stack, tenant: str) -> set[str]:
    seats = _store(stack).tenant_limits().seats(tenant)
    return {s.holder or "" for s in seats if s.live(now_ms())}


def test_a_tenant_holds_at_most_its_limit_and_the_one_over_spends_nothing(stack: Stack) -> None:
    store = _store(stack)
    first, second, third = _envelope(), _envelope(), _envelope()
    store.create(third)
    leases = [_take(store, first), _take(store, second)]
    assert {lease.seat for lease in leases} == {0, 1}
    with pytest.raises(TenantAtLimit) as refused:
        _take(store, third)
    assert (refused.value.tenant, refused.value.limit) == ("busy", 2)
    waiting = store.require(third.tenant, third.request_id)
    assert (waiting.state, waiting.attempt) == (TaskState.PENDING, 0), "no attempt spent"
    assert _live_holders(stack, "busy") == {lease.token for lease in leases}
    # Another tenant has seats of its own.
    assert _take(store, _envelope("calm")).seat is not None


def test_finalize_frees_the_seat_in_the_same_write(stack: Stack) -> None:
    store = _store(stack)
    done, running, waiting = _envelope(), _envelope(), _envelope()
    lease = _take(store, done)
    _take(store, running)
    record = store.finalize(lease, TaskState.COMPLETED, fields={"result": {"ok": True}})
    assert record.state is TaskState.COMPLETED and record.raw["result"] == {"ok": True}
    assert lease.token not in _live_holders(stack, "busy")
    assert _take(store, waiting).seat == lease.seat


def test_a_give_back_frees_the_seat_and_the_retry_counts_its_attempt(stack: Stack) -> None:
    """A retried task's attempt is not 0: the seated lock's first guess is refused and
    the second, from the refused item, holds."""
    store = _store(stack)
    envelope = _envelope()
    first = _take(store, envelope, limit=1)
    store.finalize(first, TaskState.RETRYING, retry_at_ms=now_ms())
    assert not _live_holders(stack, "busy")
    second = _take(store, envelope, limit=1)
    assert second.attempt == 2
    assert store.require(envelope.tenant, envelope.request_id).attempt == 2
    store.finalize(second, TaskState.RETRYING, retry_at_ms=now_ms())
    with pytest.raises(AttemptsExhausted):
        _take(store, envelope, limit=1, max_attempts=2)
    assert not _live_holders(stack, "busy"), "a refused lock takes no seat"


def test_a_task_held_elsewhere_takes_no_seat(stack: Stack) -> None:
    store = _store(stack)
    envelope = _envelope()
    store.acquire(envelope, worker_id="holder", lease_seconds=30, max_attempts=3)
    with pytest.raises(TaskHeldElsewhere):
        _take(store, envelope)
    assert not _live_holders(stack, "busy")


def test_a_lapsed_seat_is_free_again_and_its_old_holder_loses_it(stack: Stack) -> None:
    """A worker that died holds its seat only until its lease would have ended."""
    store = _store(stack)
    # Live through the refusal however slow the machine; then it lapses at once.
    crashed = _take(store, _envelope(), limit=1, lease_seconds=30)
    with pytest.raises(TenantAtLimit):
        _take(store, _envelope(), limit=1)
    crashed = store.renew(crashed, lease_seconds=0.05)
    wait_for(lambda: now_ms() > crashed.effective_until_ms, message="the lease lapses")
    heir = _take(store, _envelope(), limit=1)
    assert heir.seat == crashed.seat
    # A holder that was only frozen finds its seat taken: the lease is lost, and ending
    # its attempt leaves the new holder's seat alone.
    renewals = store.renew_leases([crashed], lease_seconds=30)
    assert renewals.lost == [crashed] and not renewals.renewed
    store.finalize(crashed, TaskState.FAILED)
    assert _live_holders(stack, "busy") == {heir.token}


def test_the_heartbeat_renews_task_and_seat_together(stack: Stack) -> None:
    store = _store(stack)
    seated = _take(store, _envelope(), lease_seconds=1)
    plain = store.acquire(_envelope(), worker_id="w1", lease_seconds=1, max_attempts=3)
    renewals = store.renew_leases([seated, plain], lease_seconds=60)
    assert {lease.token for lease in renewals.renewed} == {seated.token, plain.token}
    renewed = next(lease for lease in renewals.renewed if lease.token == seated.token)
    assert renewed.seat == seated.seat
    seat = next(s for s in store.tenant_limits().seats("busy") if s.holder == seated.token)
    record = store.require("busy", seated.request_id)
    assert seat.lease_until_ms == record.effective_until_ms == renewed.effective_until_ms
    single = store.renew(renewed, lease_seconds=90)
    assert single.effective_until_ms > renewed.effective_until_ms


def test_racing_workers_never_exceed_the_limit(stack: Stack) -> None:
    envelopes = [_envelope() for _ in range(12)]
    barrier = threading.Barrier(len(envelopes))
    won: list[Lease] = []
    refused: list[LockNotAcquired] = []
    guard = threading.Lock()

    def contend(envelope: TaskEnvelope) -> None:
        # A client each, as separate workers would have.
        store = TaskStore(AwsClients("eu-west-1").dynamodb, stack.resources.table_name)
        barrier.wait()
        try:
            lease = _take(store, envelope, limit=3)
        except LockNotAcquired as refusal:
            with guard:
                refused.append(refusal)
        else:
            with guard:
                won.append(lease)

    threads = [threading.Thread(target=contend, args=(e,)) for e in envelopes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == 3 and len(refused) == 9
    assert sorted(lease.seat or 0 for lease in won) == [0, 1, 2]
    assert all(isinstance(r, TenantAtLimit) for r in refused)


def test_overrides_are_set_listed_and_cleared(stack: Stack) -> None:
    limits = TenantLimitStore(stack.dynamodb, stack.resources.table_name)
    limits.set("acme", 3)
    limits.set("zeta", 0)
    assert limits.get("acme") == 3 and limits.get("zeta") == 0 and limits.get("other") is None
    settle_indexes(stack)  # listed through the byTenant index
    assert [(o.tenant, o.limit) for o in limits.overrides()] == [("acme", 3), ("zeta", 0)]
    limits.clear("acme")
    assert limits.get("acme") is None
    settle_indexes(stack)
    assert [o.tenant for o in limits.overrides()] == ["zeta"]


def test_transcripts_off_sits_beside_the_limit_and_each_change_keeps_the_other(
    stack: Stack,
) -> None:
    limits = TenantLimitStore(stack.dynamodb, stack.resources.table_name)
    limits.set_transcripts("acme", stored=False)
    assert limits.settings("acme") == TenantSettings(limit=None, transcripts=False)
    limits.set("acme", 3)
    assert limits.settings("acme") == TenantSettings(limit=3, transcripts=False)
    limits.clear("acme")
    assert limits.settings("acme") == TenantSettings(limit=None, transcripts=False)
    settle_indexes(stack)
    assert limits.transcripts_off() == ["acme"]
    assert limits.overrides() == []  # no limit override: not listed as one
    limits.set("acme", 2)
    limits.set_transcripts("acme", stored=True)
    assert limits.settings("acme") == TenantSettings(limit=2, transcripts=True)
    limits.clear("acme")
    # Nothing left to say: the item is gone, not left empty.
    assert stack.dynamodb.get_item(TableName=stack.resources.table_name,
                                   Key={"PK": {"S": "TENANT#acme"}, "SK": {"S": "LIMITS"}},
                                   ConsistentRead=True).get("Item") is None  # fmt: skip


def test_a_worker_reads_transcripts_through_the_limits_cache_in_one_read(stack: Stack) -> None:
    inner, counting, clock, cache = _acme_at_5(stack, default=0)
    inner.set_transcripts("acme", stored=False)
    assert cache.limit("acme") == 5 and cache.transcripts("acme") is False
    assert counting.reads == 1  # one item, one read, both settings
    inner.set_transcripts("acme", stored=True)
    assert cache.transcripts("acme") is False  # the cache holds for its 30 s
    clock.now += 31
    assert cache.transcripts("acme") is True and counting.reads == 2
    # Unreadable and never read: unknown (the worker then stores nothing).
    failing = CachedTenantLimits(_CountingStore(inner, fail=True), default=0, clock=clock)
    assert failing.transcripts("zeta") is None and failing.limit("zeta") == 0


def test_a_malformed_override_in_the_table_is_ignored(stack: Stack) -> None:
    limits = TenantLimitStore(stack.dynamodb, stack.resources.table_name)
    stack.dynamodb.put_item(
        TableName=stack.resources.table_name,
        Item={"PK": {"S": "TENANT#odd"}, "SK": {"S": "LIMITS"},
              "concurrencyLimit": {"S": "lots"}},
    )  # fmt: skip
    assert limits.get("odd") is None
    assert CachedTenantLimits(limits, default=4).limit("odd") == 4


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _CountingStore(TenantLimitStore):
    def __init__(self, inner: TenantLimitStore, fail: bool = False) -> None:
        self.inner = inner
        self.reads = 0
        self.listings = 0
        self.fail = fail

    def settings(self, tenant: str, *, consistent: bool = False) -> TenantSettings:
        self.reads += 1
        if self.fail:
            raise RuntimeError("throttled past every retry")
        return self.inner.settings(tenant, consistent=consistent)

    def overrides(self) -> list[TenantLimit]:
        self.listings += 1
        if self.fail:
            raise RuntimeError("throttled past every retry")
        return self.inner.overrides()


def _acme_at_5(stack: Stack, *, default: int) -> tuple[TenantLimitStore, _CountingStore, _Clock, CachedTenantLimits]:  # fmt: skip
    """A cache (30 s) over a store that counts its reads; tenant `acme` limited to 5."""
    inner = TenantLimitStore(stack.dynamodb, stack.resources.table_name)
    inner.set("acme", 5)
    settle_indexes(stack)  # the overrides are listed through the byTenant index
    counting, clock = _CountingStore(inner), _Clock()
    return inner, counting, clock, CachedTenantLimits(counting, default=default, ttl_s=30, clock=clock)  # fmt: skip


class _SlowListing(_CountingStore):
    """A listing that takes as long as the test says (a throttled Query's retries)."""

    def __init__(self, inner: TenantLimitStore) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def overrides(self) -> list[TenantLimit]:
        self.entered.set()
        assert self.go_on.wait(timeout=30), "the test never let the listing end"
        return super().overrides()


def test_a_guess_never_waits_for_another_threads_listing(stack: Stack) -> None:
    """The guessers are the receiving threads: while one lists (slowly), the others go
    on with the last listing, or without a guess before the first."""
    inner = TenantLimitStore(stack.dynamodb, stack.resources.table_name)
    inner.set("acme", 5)
    settle_indexes(stack)  # the overrides are listed through the byTenant index
    slow, clock = _SlowListing(inner), _Clock()
    cache = CachedTenantLimits(slow, default=0, ttl_s=30, clock=clock)
    first = threading.Thread(target=cache.guess, args=("acme",))
    first.start()
    assert slow.entered.wait(timeout=10)
    try:
        assert cache.guess("acme") is None, "no listing yet: no guess (its lock reads)"
    finally:
        slow.go_on.set()
        first.join(timeout=30)
    assert cache.guess("acme") == 5 and slow.listings == 1
    slow.go_on.clear()
    slow.entered.clear()
    inner.set("acme", 2)
    settle_indexes(stack)
    clock.now = 31  # the listing is due again
    second = threading.Thread(target=cache.guess, args=("other",))
    second.start()
    assert slow.entered.wait(timeout=10)
    try:
        assert cache.guess("acme") == 5, "meanwhile the last listing stands"
    finally:
        slow.go_on.set()
        second.join(timeout=30)
    assert cache.guess("acme") == 2 and slow.listings == 2


def test_the_limit_cache_reads_once_per_tenant_per_interval(stack: Stack) -> None:
    inner, counting, clock, cache = _acme_at_5(stack, default=2)
    assert [cache.limit("acme") for _ in range(50)] == [5] * 50
    assert cache.limit("other") == 2
    assert counting.reads == 2
    inner.set("acme", 1)
    clock.now = 29
    assert cache.limit("acme") == 5, "the cached answer stands within the interval"
    clock.now = 31
    assert cache.limit("acme") == 1 and counting.reads == 3
    counting.fail = True
    clock.now = 62
    assert cache.limit("acme") == 1, "a failed read keeps the last answer"
    assert cache.limit("acme") == 1 and counting.reads == 4, "and does not retry at once"


def test_a_guess_lists_every_override_once_per_interval_never_a_read_per_tenant(
    stack: Stack,
) -> None:
    inner, counting, clock, cache = _acme_at_5(stack, default=0)
    assert [cache.guess(t) for t in ("acme", "other", "third")] == [5, 0, 0]
    assert (counting.listings, counting.reads) == (1, 0), "one listing for every tenant"
    inner.set("late", 3)
    settle_indexes(stack)
    clock.now = 29
    assert cache.guess("late") == 0 and counting.listings == 1, "the listing stands"
    clock.now = 31
    assert cache.guess("late") == 3 and counting.listings == 2
    assert cache.limit("acme") == 5 and counting.reads == 1  # a lock's read
    inner.set("acme", 1)
    clock.now = 1_000
    assert cache.guess("acme") == 5, "a tenant read stays as read: `limit` refreshes it"
    assert (counting.listings, counting.reads) == (2, 1)
    counting.fail = True
    clock.now = 2_000
    assert cache.guess("new") is None, "an unreadable listing: no guess (its lock reads)"
    assert cache.guess("newer") is None and counting.listings == 3, "not asked again at once"
    counting.fail = False
    clock.now = 2_006
    assert cache.guess("newer") == 0 and counting.listings == 4
