"""Parked messages: a limited tenant's message refused a seat waits here for one.

Without parking a refusal sends the message back to its queue (a fresh copy, delayed
by `TENANT_LIMIT_BACKOFF`), and a flood of one limited tenant's work goes round and
round: each turn a receive, a lock transaction, a seats query, a send and a delete,
about six turns per task at a limit of 2 of 8 slots (docs/benchmarks.md). A parked
message instead stays in this worker, invisible (the heartbeat extends it like any
held message) and without a slot, and its lock is tried again:

- at once when a task of its tenant ends here (its seat is free now): one parked
  message per seat freed, not all of them, and it asks for that seat, so a freed seat
  costs one transaction;
- else after the back-off, for a seat freed on another worker: it looks at its
  tenant's seats first (one strongly consistent query), and tries the transaction only
  for a seat it saw free. A refused transaction cost that query anyway, on top of two
  transactional writes (each twice a plain write's capacity);
- until `TENANT_LIMIT_PARK` has passed; then it goes back to its queue as before, so
  a parked message never keeps a task of another worker's from running for long.

A parked message holds a thread of the gate pool and its place in the buffer, never a
slot; a slot idle only behind parked messages still receives now and then
(worker.receive.placement), so other tenants' work arriving meanwhile starts beside it. Each
tenant may park half this worker's slots, all tenants together its slots; a message
refused past that bound goes back at once, and one of a tenant that is parked full goes
back without a lock transaction (the parked ones were refused within the back-off and
are tried first).

A tenant refused here within the back-off is taken to be still at its limit: its next
message parks (or, with no room, goes back) without a lock transaction, and tries when
a seat frees here or after the back-off like any parked one. Under a limited tenant's
flood, most of its received messages used to spend a transaction and a seats query on a
refusal that parking then repeated (docs/benchmarks.md): two refusals per task at a
limit of 2 of 8 slots, on the same DynamoDB every other tenant's lock waits on.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# Retries sooner than this after a refusal would only repeat it.
MIN_RETRY_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class Wake:
    """Why a parked message tries its lock again."""

    # A task of its tenant ended here: a seat is free now (else: its back-off passed,
    # and a seat may have freed on another worker).
    freed_here: bool
    seat: int | None = None  # the seat that task held, when known


class SeatWaits:
    """Where parked messages wait for a seat of their tenant; shared by the gate threads.

    The placement (worker.receive.placement) builds it under its own lock, so a message's
    one state there (gated, parked) changes with the seat waits: `for_message` gives the
    view a gated message's preparation parks through, and `on_park(key, parked)` tells
    the placement, under that lock, when the message starts and stops waiting."""

    def __init__(
        self,
        *,
        slots: int,
        retry_s: float,
        park_s: float,
        clock: Callable[[], float] = time.monotonic,
        cond: threading.Condition | None = None,
        on_park: Callable[[int, bool], None] | None = None,
    ) -> None:
        self._retry_s = max(MIN_RETRY_S, retry_s)
        self._park_s = park_s
        self._clock = clock
        self._per_tenant = max(1, slots // 2)
        self._total = max(1, slots) if park_s > 0 else 0
        self._cond = cond if cond is not None else threading.Condition()
        self._on_park = on_park
        self._key: int | None = None  # the message this view parks (`for_message`)
        self._waiting: dict[str, int] = {}  # parked messages by tenant
        # Seats freed here not yet taken by a parked message (their index, when known).
        self._freed: dict[str, list[int | None]] = {}
        self._refused_until: dict[str, float] = {}  # a lock refused here: at limit till then
        self._closed = threading.Event()  # an object, so every view shares it

    def for_message(self, key: int) -> SeatWaits:
        """The same seat waits, parking the message the placement knows as `key`."""
        view = copy.copy(self)
        view._key = key
        return view

    @property
    def parked(self) -> int:
        with self._cond:
            return sum(self._waiting.values())

    def full(self, tenant: str) -> bool:
        """Whether `tenant` has parked all it may here: it is at its limit as of its
        parked messages' last try, and they take the next seat freed here first."""
        with self._cond:
            return self._waiting.get(tenant, 0) >= self._per_tenant

    def refused(self, tenant: str) -> None:
        """A lock of `tenant` was refused for its limit: for the back-off, its next
        messages here park without trying (`refused_lately`). A parked message taking a
        seat does not end that: it took the seat freed here, which says nothing of the
        others."""
        with self._cond:
            self._refused_until[tenant] = self._clock() + self._retry_s

    def refused_lately(self, tenant: str) -> bool:
        with self._cond:
            until = self._refused_until.get(tenant)
            if until is not None and until <= self._clock():
                del self._refused_until[tenant]
                until = None
            return until is not None

    def room(self, tenant: str) -> bool:
        """Whether a message of `tenant` refused now may park here."""
        with self._cond:
            return not self._closed.is_set() and self._room(tenant)

    def _room(self, tenant: str) -> bool:
        return (
            self._waiting.get(tenant, 0) < self._per_tenant
            and sum(self._waiting.values()) < self._total
        )

    def park(self, tenant: str, since: float) -> Wake | None:
        """A message refused a seat of `tenant`, first parked at `since` (monotonic):
        wait for a seat. A `Wake`: try the lock again now; None: stop waiting (its park
        time is over, this worker drains, or it may not park at all) and send it back."""
        with self._cond:
            if self._closed.is_set() or self._clock() - since >= self._park_s:
                return None
            if not self._room(tenant):
                return None
            self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
            self._parking(True)
            try:
                # Jittered, so parked messages of one tenant on several workers do not
                # all try at the same instant.
                retry_at = self._clock() + random.uniform(self._retry_s / 2, self._retry_s)
                retry_at = min(retry_at, since + self._park_s)
                while not self._closed.is_set() and not self._freed.get(tenant):
                    left = retry_at - self._clock()
                    if left <= 0:
                        return Wake(freed_here=False)
                    self._cond.wait(left)
                if self._closed.is_set():
                    return None
                return Wake(freed_here=True, seat=self._freed[tenant].pop(0))
            finally:
                self._parking(False)
                self._waiting[tenant] -= 1
                if not self._waiting[tenant]:
                    del self._waiting[tenant]
                    self._freed.pop(tenant, None)

    def _parking(self, parked: bool) -> None:
        if self._on_park is not None and self._key is not None:
            self._on_park(self._key, parked)

    def freed(self, tenant: str, seat: int | None = None) -> bool:
        """A task of `tenant` ended here (its seat, if it held one, is free): wake one
        parked message of that tenant, if any, to take `seat` (its index, if known).
        Whether one was parked: only then may more of its messages park here."""
        with self._cond:
            waiting = self._waiting.get(tenant, 0)
            if not waiting:
                return False
            freed = self._freed.setdefault(tenant, [])
            # More wake-ups than parked messages would only spin refused ones.
            if len(freed) < waiting:
                freed.append(seat)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        """The worker drains: every parked message stops waiting and goes back."""
        with self._cond:
            self._closed.set()
            self._cond.notify_all()
