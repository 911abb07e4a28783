"""The worker's side of tenant concurrency limits, in one place.

A limited tenant's message is locked before it takes a slot (worker.intake, "gated"),
on a pool of its own: a flood of them must not queue other tenants' preparations
behind it. Refused a seat, it is parked (worker.seatwait). A well-formed message of a
tenant parked full here goes straight back to its queue (a malformed one is gated, and
its preparation rejects it), and a receive that brought nothing else cools its tier
(worker.cooling). A task that ends here may free a seat: its tenant's next parked
message tries for it, and if one was parked, every tier may be received again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agentq.config import Settings
from worker.batcher import SqsBatcher, message_log
from worker.cooling import TierCooling
from worker.inflight import InFlight
from worker.seatwait import SeatWaits

logger = logging.getLogger(__name__)

Prepare = Callable[[Mapping[str, Any], InFlight, SeatWaits], Any]


class LimitedTenants:
    def __init__(
        self,
        settings: Settings,
        batcher: SqsBatcher,
        *,
        well_formed: Callable[[Mapping[str, Any]], bool],
        waiting: Callable[[Mapping[str, Any]], None] = lambda _: None,
    ) -> None:
        self._batcher = batcher
        self._well_formed = well_formed
        self._waiting = waiting
        self._backoff_s = settings.tenant_limit_backoff_ms / 1000
        self.seats = SeatWaits(
            slots=settings.max_concurrent,
            retry_s=self._backoff_s,
            park_s=settings.tenant_limit_park_ms / 1000,
        )
        self.cooling = TierCooling()
        # One thread a slot for locks, one more a slot for parked messages waiting.
        self._locks = ThreadPoolExecutor(2 * settings.max_concurrent, thread_name_prefix="gate")

    def lock(self, prepare: Prepare, message: Mapping[str, Any], entry: InFlight) -> Future[Any]:
        """Take the message's lock (and seat) on the gate pool, parking it if refused."""
        return self._locks.submit(prepare, message, entry, self.seats)

    def parked_full(self, tenant: str, message: Mapping[str, Any]) -> bool:
        """Whether `message` goes straight back: its tenant has parked all it may here.
        Only a well-formed one: a malformed message is gated like any, and its
        preparation rejects it (recorded and deleted) instead of sending it round while
        its tenant stays at its limit."""
        return self.seats.full(tenant) and self._well_formed(message)

    def send_back(self, message: Mapping[str, Any], tenant: str) -> None:
        """Back to its queue unread, as a fresh copy after the back-off (no lock, no
        attempt, no receive counted): a lock could only be refused."""
        delay = random.uniform(self._backoff_s / 2, self._backoff_s)
        logger.info("tenant at its concurrency limit; sent back (parked full here)",
                    extra={**message_log(message), "tenant": tenant, "delay_s": delay})  # fmt: skip
        self._batcher.give_back(message["ReceiptHandle"], message, delay, fresh=True)
        # Its message lives on, so the reconciler must not count the task lost: marked
        # on the gate pool, off the receive loop that called this.
        self._locks.submit(self._waiting, message)

    def cool(self, tier: str) -> None:
        """A receive from `tier` was all sent back: leave it alone for the back-off."""
        self.cooling.cool(tier, self._backoff_s)

    def task_ended(self, tenant: str, seat: int | None = None) -> None:
        """A task of `tenant` ended here, holding `seat` (its index) if it held one.
        Tiers cool only for tenants parked full here, so only the end of one of theirs
        warms them: another tenant's end changes nothing for them, and warming then
        brought one more receive of the limited flood, all of it sent back."""
        if self.seats.freed(tenant, seat):
            self.cooling.warm()

    def close(self) -> None:
        """The worker drains: parked messages stop waiting (and go back)."""
        self.seats.close()

    def shutdown(self) -> None:
        self._locks.shutdown(wait=True)
