"""The worker's side of tenant concurrency limits, in one place.

A limited tenant's message is locked before it takes a slot (worker.receive.placement, "gated"),
on a pool of its own: a flood of them must not queue other tenants' preparations
behind it. Refused a seat, it is parked (worker.parking). A well-formed message of a
tenant parked full here goes straight back to its queue, delayed by the back-off (a
malformed one or one not yet due is gated, and its preparation settles it). A task that
ends here may free a seat: its tenant's next parked message tries for it.

The receiver goes on receiving while a slot is free, even when a whole receive went
back: another tenant's runnable message may wait behind the flood (a queue without fair
queues hands messages out oldest first), and a free slot must not idle while it waits
(docs/architecture.md, "Tenant limits"). What that costs is bounded: a message sent
back is invisible for the back-off, so each waiting message of a tenant at its limit
costs at most one receive, one send and one delete (each batched by ten) per back-off.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agentq.config import Settings
from worker.inflight import InFlight
from worker.parking import SeatWaits

Prepare = Callable[[Mapping[str, Any], InFlight, SeatWaits], Any]


class LimitedTenants:
    def __init__(
        self,
        settings: Settings,
        seats: SeatWaits,
        *,
        waits_for_seat: Callable[[Mapping[str, Any]], bool],
        waiting: Callable[[Mapping[str, Any]], None] = lambda _: None,
    ) -> None:
        self._waits_for_seat = waits_for_seat
        self._waiting = waiting
        self._backoff_s = settings.tenant_limit_backoff_ms / 1000
        self.seats = seats  # the placement's, under its lock
        # One thread a slot for locks, one more a slot for parked messages waiting.
        self._locks = ThreadPoolExecutor(2 * settings.max_concurrent, thread_name_prefix="gate")

    def lock(self, prepare: Prepare, message: Mapping[str, Any], entry: InFlight) -> Future[Any]:
        """Take the message's lock (and seat) on the gate pool, parking it if refused."""
        return self._locks.submit(prepare, message, entry, self.seats.for_message(id(entry)))

    def parked_full(self, tenant: str, message: Mapping[str, Any]) -> bool:
        """Whether `message` goes straight back: its tenant has parked all it may here.
        Only a well-formed one that is due: a malformed message is gated like any, and
        its preparation rejects it (recorded and deleted) instead of sending it round
        while its tenant stays at its limit; one not yet due is re-delayed until due."""
        return self.seats.full(tenant) and self._waits_for_seat(message)

    def backoff_s(self) -> float:
        """How long a message of a tenant parked full here waits in its queue before it
        is received again (jittered, so its copies do not come back together)."""
        return random.uniform(self._backoff_s / 2, self._backoff_s)

    def waiting(self, message: Mapping[str, Any]) -> None:
        """A message sent back for its tenant's limit lives on, so the reconciler must
        not count its task lost: marked on the gate pool, off the receive loop."""
        self._locks.submit(self._waiting, message)

    def task_ended(self, tenant: str, seat: int | None = None) -> None:
        """A task of `tenant` ended here, holding `seat` (its index) if it held one: a
        parked message of its tenant takes that seat."""
        self.seats.freed(tenant, seat)

    def close(self) -> None:
        """The worker drains: parked messages stop waiting (and go back)."""
        self.seats.close()

    def shutdown(self) -> None:
        self._locks.shutdown(wait=True)
