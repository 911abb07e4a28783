"""Slots and the short prefetch buffer in front of them.

A slot is busy from the moment a message is handed to it until its child exits; the
settle chain after that (upload, finalize, event, delete) runs without holding the slot,
so the next task starts while the last one is still being written down.

The receiver asks SQS when a free slot would otherwise idle or the prefetch runs below
half its size, for the free slots plus the prefetch: as many messages as this worker's
slots have been freeing per `PREFETCH_HORIZON` (the recent rate of child ends). A freed
slot takes the next prefetched message at once, and one receive serves several tasks
when tasks are short. When tasks are long the rate, and so the prefetch, falls to zero:
a message never waits long in a worker that cannot start it while another worker idles.
The rate counts ends, not starts: filling empty slots (a worker just started, or idle
when a burst arrives) says nothing about how soon one frees, and counting those starts
had a fresh worker lock one more message per slot behind tasks that ran for minutes.
Prefetched messages are in the in-flight registry, so the heartbeat keeps them
invisible until they start. Each is validated and locked while it waits (the
consumer's `prepare`), so the lock's round trip is not on the slot's path either; the
heartbeat renews that lease like a running task's.

With priority tiers (docs/scheduling.md) a freed slot takes the highest-priority
buffered message: one received on its tier's starvation turn (weighted mode) goes first;
then one of the highest tier; otherwise one buffered
longer than `BUFFER_AGE_FIRST_S` goes first, so the buffer starves nobody; and each lower tier may fill one place less of the prefetch
than the tier above it (down to one place): a flood of low-priority work cannot take
the space that keeps a high-priority message ready to start. Free slots are open to
every tier.

A message of a tenant with a concurrency limit is *gated*: it is locked (and so takes
its tenant's seat) before it takes a slot, not in one. While its lock is pending it
holds a place in the buffer, so the receiver asks for nothing more on its account, but
not a slot: a message that arrives meanwhile (a watched tier's) takes the free slot.
Locked, it takes a free slot or waits for the next like any buffered message; refused
(its tenant at its limit), it is settled without ever holding one. Without the gate a
flood of a limited tenant's work held every free slot with refusals (a lock transaction
and a back-off each), and the other tenants' work waited behind them. A refused message
may be parked instead (worker.parking): it stays in the buffer while it waits for a
seat, but holds no room of the receiver's, so other tenants' work is still received.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Final, Literal

from worker.inflight import InFlight
from worker.parking import SeatWaits

# How far back the start rate is measured; long enough to smooth, short enough to adapt.
RATE_WINDOW_S: Final = 10.0
MAX_RECEIVE: Final = 10  # SQS ReceiveMessage maximum
# A buffered message waits at most about this long behind higher-priority arrivals.
BUFFER_AGE_FIRST_S: Final = 10.0

Message = dict[str, Any]
# A received message, its in-flight record and, once buffered, its preparation.
Held = tuple[Message, InFlight, "Future[Any] | None"]
# What became of a gated message once its lock was decided (`Placement.settle_gate`).
GateOutcome = Literal["start", "wait", "surplus", "settle", "gone"]
# A buffered message's one state: ready for a slot, its lock pending (gated), or its lock
# refused and waiting for a seat (parked). A running one is out of the buffer, in `busy`.
State = Literal["ready", "gated", "parked"]


class Placement:
    """The slots, the prefetch buffer, the gate and parking, under one lock."""

    def __init__(
        self,
        size: int,
        *,
        horizon_s: float,
        clock: Callable[[], float] = time.monotonic,
        ranks: Mapping[str, int] | None = None,
        overtake_after_s: float | None = None,
        park_retry_s: float = 1.0,
        park_s: float = 0.0,
    ) -> None:
        self.size = size
        self._ranks = dict(ranks or {})  # priority tier → rank (0 highest)
        # Weighted and round-robin modes: a lower-tier message buffered this long goes
        # before the highest tier too (the starvation bound holds at the hand-over, not
        # only at the receive). Strict mode (None): the highest tier is never overtaken.
        self._overtake_after_s = overtake_after_s
        self._horizon = horizon_s
        self._clock = clock
        self._busy = 0
        self._buffer: deque[Held] = deque()
        self._state: dict[int, State] = {}  # by id() of each buffered message's entry
        self._frees: deque[float] = deque()  # when each child ended (its slot freed)
        self._born = clock()
        self._cond = threading.Condition()
        # Parked messages (worker.parking) wait on this lock: buffered, but they
        # hold no room of the receiver's (a tenant parked full sends its next ones back).
        self.seats = SeatWaits(slots=size, retry_s=park_retry_s, park_s=park_s,
                               cond=self._cond, on_park=self._parked)  # fmt: skip

    # -- what the receiver asks ----------------------------------------------------------
    @property
    def busy(self) -> int:
        with self._cond:
            return self._busy

    @property
    def buffered(self) -> int:
        with self._cond:
            return len(self._buffer)

    def wait_watch(self, tier: str, reserve: int, timeout_s: float) -> tuple[int, int]:
        """Messages a watched tier's long poll may ask for, and how many of them are
        reserve places: the free slots, plus its `reserve` less what of it is buffered
        already while a lower-tier message waits ready in the buffer; (0, 0) after
        `timeout_s` if none.

        Only such a message would take the next slot that frees here before this tier
        could ask for it. Lower-tier work that merely runs, or waits for its lock or a
        seat (gated, parked), leaves the next freed slot free, and the long poll takes
        it within a receive. A message reserved then would wait here for a hand-over
        while another worker may have a free slot: beside a tenant at its limit (parked
        messages, its tasks running) that was most of B's and C's extra wait."""
        rank = self._ranks.get(tier, 0)

        def room() -> tuple[int, int]:
            held = sum(1 for _, entry, _ in self._buffer if entry.tier == tier)
            lower = any(
                self._ranks.get(entry.tier or "", 0) > rank
                for _, entry, _ in self._buffer
                if self._state.get(id(entry)) == "ready"
            )
            # A gated message whose lock is pending holds no slot: a watched tier's
            # message may take it.
            free = max(0, self.size - self._busy - self._ready())
            asked = max(0, min(MAX_RECEIVE, free + (reserve - held if lower else 0)))
            return asked, max(0, asked - free)

        with self._cond:
            self._cond.wait_for(lambda: room()[0] > 0, timeout=timeout_s)
            return room()

    def wait_wanted(self, timeout_s: float) -> int:
        """Messages to ask SQS for, once a free slot has nothing to start or the
        prefetch has run below half its size; 0 after `timeout_s` otherwise."""
        with self._cond:
            self._cond.wait_for(self._hungry, timeout=timeout_s)
            if not self._hungry():
                return 0
            free = self.size - self._busy - self._holding()
            return max(0, min(MAX_RECEIVE, free + self._prefetch()))

    def rooms(self, wanted: int, tiers: Sequence[str]) -> dict[str, int]:
        """Of `wanted`, how many each tier may bring: every free slot, and the prefetch
        less one place per rank (those places stay for the tiers above) but never less
        than one place, so every tier keeps the prefetch's benefit."""
        with self._cond:
            idle = max(0, self.size - self._busy - self._holding())
            prefetch = max(0, wanted - idle)
            return {
                tier: min(wanted, idle + max(min(prefetch, 1), prefetch - self._ranks.get(tier, 0)))
                for tier in tiers
            }

    def _hungry(self) -> bool:
        if self.size - self._busy > self._holding():
            return True  # a free slot would idle
        # Refill before the buffer runs dry, so a slot never waits for a receive.
        return self._holding() < (self._prefetch() + 1) // 2

    def _holding(self) -> int:
        """Buffered messages that hold the receiver's room: all but the parked ones.
        A parked message may wait for a seat for seconds; holding room meanwhile would
        leave other tenants' messages in the queue (where SQS's fair queue would hand
        them out first) for as long."""
        return sum(1 for state in self._state.values() if state != "parked")

    def _prefetch(self) -> int:
        """Messages this worker expects to start within the horizon: as many as its slots
        freed in a horizon, at the recent rate."""
        if self._horizon <= 0:
            return 0
        now = self._clock()
        while self._frees and self._frees[0] < now - RATE_WINDOW_S:
            self._frees.popleft()
        window = min(RATE_WINDOW_S, max(now - self._born, 1.0))
        # At most one per slot: a worker killed while holding prefetched locks costs each
        # of those tasks an attempt. With the receiver woken at every hand-over that
        # lowers the buffer, one per slot keeps the slots busy (bench/saturation.py:
        # 1.02-1.03 even, 1.05 uneven; two per slot measured within 0.01 of that).
        return min(self.size, int(len(self._frees) / window * self._horizon))

    # -- messages in and out -------------------------------------------------------------
    def full(self) -> bool:
        """Every slot is busy: an arriving message would wait for a hand-over."""
        with self._cond:
            return self._busy >= self.size

    def surplus(self) -> bool:
        """Every slot is busy and the buffer already holds what this worker expects to
        start within the horizon: an arriving message would wait here behind running
        tasks while another worker may have a free slot. (Two receivers asked for the
        same free slots: a watcher and the receive loop, say, at a worker's start.)"""
        with self._cond:
            return self._busy >= self.size and self._ready() >= self._prefetch()

    def offer(self, held: Held, prepare: Callable[[Held], Held] | None = None) -> bool:
        """A received message: True if a slot took it (the caller starts it now).

        Otherwise it is buffered, after `prepare` (which starts its preparation and
        returns it with the future) so a slot never takes an unprepared one by surprise.
        """
        with self._cond:
            if self._busy < self.size and not self._ready():
                self._take()
                return True
            self._buffer.append(prepare(held) if prepare is not None else held)
            self._state[id(held[1])] = "ready"
            return False

    def gate(self, held: Held) -> None:
        """A gated message whose lock is being taken (`held` carries that preparation):
        it waits in the buffer, without a slot, until `settle_gate`."""
        with self._cond:
            self._buffer.append(held)
            self._state[id(held[1])] = "gated"

    def settle_gate(self, held: Held, *, runnable: bool) -> GateOutcome:
        """A gated message's lock is decided. `start`: it took a free slot (the caller
        starts it); `wait`: it is an ordinary buffered message now, for the next slot
        that frees; `surplus`: locked, but every slot is busy (another message took the
        free one) and the buffer already holds what this worker expects to start soon,
        so it is out of the buffer for the caller to give back rather than hold its
        seat behind a long task while another worker may idle; `settle`: refused, out
        of the buffer, settled by the caller without a slot; `gone`: a drain took it
        from the buffer meanwhile (and gives it back)."""
        with self._cond:
            if self._state.get(id(held[1])) not in ("gated", "parked"):
                return "gone"
            self._state[id(held[1])] = "ready"
            index = next(i for i, item in enumerate(self._buffer) if item[1] is held[1])
            self._cond.notify_all()
            if runnable and self._busy >= self.size:
                if self._ready() <= self._prefetch():
                    return "wait"
                self._remove(index)
                return "surplus"
            self._remove(index)
            if not runnable:
                return "settle"
            self._take()
            return "start"

    def release(self) -> Held | None:
        """A slot's child ended: the next buffered message keeps the slot, or it frees."""
        with self._cond:
            self._frees.append(self._clock())
            if self._ready():
                # The buffer may now be below its refill mark: wake the receiver, or it
                # would only notice at its next wait's timeout.
                self._cond.notify_all()
                return self._next_buffered()
            self._busy -= 1
            self._cond.notify_all()
            return None

    def drop_buffered(self) -> list[Held]:
        """Everything prefetched and not started (shutdown gives them back)."""
        with self._cond:
            held = list(self._buffer)
            self._buffer.clear()
            self._state.clear()
            self._cond.notify_all()
            return held

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout=timeout_s)

    def _ready(self) -> int:
        """Buffered messages a slot may take now (not gated with their lock pending)."""
        return sum(1 for state in self._state.values() if state == "ready")

    def _next_buffered(self) -> Held:
        if not self._ranks and self._ready() == len(self._buffer):
            return self._remove(0)
        now = time.monotonic()

        def order(i: int) -> tuple[int, int, int]:
            entry = self._buffer[i][1]
            rank = self._ranks.get(entry.tier or "", 0)
            waited = now - entry.received_at
            overtakes = self._overtake_after_s is not None and waited >= self._overtake_after_s
            if entry.starving or (rank > 0 and overtakes):
                return (0, -1, i)  # starving: ahead of every tier, oldest first
            # Otherwise the highest tier is not overtaken: the age rule orders the rest.
            aged = rank > 0 and waited >= BUFFER_AGE_FIRST_S
            return (1 if rank == 0 else 2 if aged else 3, rank, i)

        ready = [i for i, item in enumerate(self._buffer) if self._state[id(item[1])] == "ready"]
        return self._remove(min(ready, key=order))

    def _remove(self, index: int) -> Held:
        held = self._buffer[index]
        del self._buffer[index]
        del self._state[id(held[1])]
        return held

    def _parked(self, key: int, parked: bool) -> None:
        """A gated message starts or stops waiting for a seat (called under the lock).
        The receiver sees the room a parked message frees at its next look (within its
        wait's timeout): waking it at once would send it through a flood faster, a
        change no benchmark has justified yet."""
        if key in self._state:  # not dropped by a drain meanwhile
            self._state[key] = "parked" if parked else "gated"

    def _take(self) -> None:
        self._busy += 1
