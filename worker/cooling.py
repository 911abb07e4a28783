"""Tiers the receiver leaves alone for a while: their last receive was all sent back.

A receive that brought only messages of tenants parked full here (worker.seatwait:
each at its limit, its parked messages first in line for the next seat) sent every one
straight back. Receiving that tier again at once would only bring the next of the same
flood: with a free slot to fill and nothing else to do, the receiver went round a
limited tenant's 500 queued tasks about twelve times each (docs/benchmarks.md). So the
tier cools for `TENANT_LIMIT_BACKOFF` (the delay those messages were sent back with),
or until a task of a tenant parked here ends (its seat goes to a parked message, and
room to park one more opens). A receive that brought
anything else, another tenant's work included, cools nothing: with one queue, other
tenants' messages reach the slots as soon as a receive meets them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping


class TierCooling:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._cond = threading.Condition()

    def cool(self, tier: str, seconds: float) -> None:
        with self._cond:
            self._until[tier] = self._clock() + seconds

    def warm(self) -> None:
        """A task of a parked tenant ended here: every tier may be received again."""
        with self._cond:
            if self._until:
                self._until.clear()
                self._cond.notify_all()

    def open(self, rooms: Mapping[str, int]) -> dict[str, int]:
        """`rooms` with every cooling tier's room 0."""
        with self._cond:
            now = self._clock()
            return {tier: 0 if self._until.get(tier, now) > now else room
                    for tier, room in rooms.items()}  # fmt: skip

    def remaining_s(self) -> int | None:
        """Whole seconds (rounded up) until the first cooling tier opens; None if none
        cools. It caps the receiver's long poll of another tier meanwhile: 20 s spent
        polling a watched tier would leave the cooled one closed long after its time."""
        with self._cond:
            ends = self._ends()
            return math.ceil(min(ends)) if ends else None

    def wait(self, timeout_s: float) -> None:
        """Until the first tier stops cooling, a `warm`, or `timeout_s`."""
        with self._cond:
            ends = self._ends()
            if ends:
                self._cond.wait(min(timeout_s, *ends))

    def _ends(self) -> list[float]:
        """Seconds until each cooling tier opens (the caller holds the lock)."""
        now = self._clock()
        return [until - now for until in self._until.values() if until > now]
