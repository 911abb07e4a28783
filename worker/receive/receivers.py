"""The worker's receiving threads, kept apart from running: one receive loop for the
slots' wants and, with priority tiers, a watcher per watched tier.

The receive loop asks the scheduler (worker.receive.tiers) which tier to receive from for what
the free slots and the prefetch want (worker.receive.placement); each watched tier keeps a long
poll of its own outstanding for the places the tiers below it may not take. Both hand
every message to `accept` (the consumer places it). Neither runs anything.

A watcher's long poll that asked for free slots only may outlive them: another receive
fills them before its message comes. Such a message is marked `pass_on="if_full"`, and
the consumer passes it to the fleet rather than hold it for a hand-over here; the
receive loop's messages are `"if_surplus"` (passed on only if the buffer already holds
the prefetch too), and a reserve place's or a starvation turn's are `"never"`. Nor
does the receive loop long-poll a watched tier beside its watcher (worker.scheduler):
it takes only a backlog already waiting there, and when none is believed to have work
and nothing else is open to it, it waits instead of receiving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal

from worker.receive.placement import MAX_RECEIVE, Placement
from worker.receive.tiers import TierReceiver

logger = logging.getLogger(__name__)

RECEIVE_ERROR_BACKOFF_S: Final = 1.0
# How often a paused watcher looks again whether the overdue tier has had its turn, and a
# receive loop with nothing to pick whether a watched tier's backlog has come in.
WATCH_PAUSE_S: Final = 0.2

# When a received message that cannot start here at once goes back to the fleet (module
# doc): "if_full" every slot is busy, "if_surplus" the prefetch is held too, or "never".
PassOn = Literal["never", "if_full", "if_surplus"]
# (message, tier, starving, pass_on) -> whether it went straight back (its tenant
# parked full here).
Accept = Callable[[dict[str, Any], str, bool, PassOn], bool]


class Receiving:
    def __init__(
        self,
        *,
        slots: Placement,
        tiers: TierReceiver,
        note_route: Callable[[str, str], None],
        accept: Accept,
        stopping: threading.Event,
    ) -> None:
        self._slots = slots
        self._tiers = tiers
        self._note_route = note_route
        self._accept = accept
        self._stopping = stopping
        self._receiver = threading.Thread(target=self._receive_loop, name="receiver", daemon=True)
        lowest = len(tiers.tiers) - 1
        self._watchers = [
            threading.Thread(target=self._watch_loop, name=f"watch-{tier}", daemon=True,
                             args=(tier, lowest - tiers.ranks[tier]))
            for tier in tiers.watched
        ]  # fmt: skip

    def start(self) -> None:
        for thread in (self._receiver, *self._watchers):
            thread.start()

    def join(self, by: float) -> None:
        """Wait (until monotonic `by`) for every thread to leave its receive; call after
        `stopping` is set."""
        for thread in (self._receiver, *self._watchers):
            if thread.ident is not None:  # started
                thread.join(timeout=max(0.0, by - time.monotonic()))

    def _received(
        self, messages: list[dict[str, Any]], tier: str, *, starving: bool, pass_on: PassOn
    ) -> bool:
        """Hand `messages` on; whether every one went straight back (a flood of tenants
        parked full here)."""
        for message in messages:
            self._note_route(message["ReceiptHandle"], self._tiers.urls[tier])
        sent_back = [self._accept(message, tier, starving, pass_on) for message in messages]
        return bool(messages) and all(sent_back)

    def _receive_loop(self) -> None:
        flood = False  # the last receive all went straight back
        while not self._stopping.is_set():
            try:
                wanted = self._slots.wait_wanted(timeout_s=0.5)
                if wanted <= 0 or self._stopping.is_set():
                    continue
                if flood:
                    # Most likely more of the same flood: a pass through it at ten a
                    # receive reaches the other tenants' messages behind it (a queue
                    # without fair queues hands out the oldest first) sooner than at the
                    # free slots' count. What comes beyond the free slots is buffered or
                    # passed on like any receive's.
                    wanted = MAX_RECEIVE
                rooms = self._slots.rooms(wanted, self._tiers.tiers)
                pick, messages = self._tiers.receive(rooms)
                if pick is None:
                    # Only watched tiers have room and none is believed to have work: the
                    # watchers' polls take what comes (looked at again within
                    # WATCH_PAUSE_S, when a watcher's receive may have found a backlog).
                    self._stopping.wait(WATCH_PAUSE_S)
                    continue
                try:
                    # A starvation turn's message must reach a slot here: it stays.
                    flood = self._received(messages, pick.tier, starving=pick.overdue,
                                           pass_on="never" if pick.overdue else "if_surplus")  # fmt: skip
                finally:
                    if pick.overdue:
                        self._tiers.turn_taken()
            except Exception:
                logger.exception("receive failed; retrying")
                self._stopping.wait(RECEIVE_ERROR_BACKOFF_S)

    def _watch_loop(self, tier: str, reserve: int) -> None:
        while not self._stopping.is_set():
            try:
                asked, reserved = self._slots.wait_watch(tier, reserve, timeout_s=0.5)
                if asked <= 0 or self._stopping.is_set():
                    continue
                if not self._tiers.may_watch(tier):
                    # Another tier's starvation turn: its message must reach a slot first.
                    self._stopping.wait(WATCH_PAUSE_S)
                    continue
                self._received(self._tiers.watch(tier, asked), tier, starving=False,
                               pass_on="if_full" if reserved == 0 else "never")  # fmt: skip
            except Exception:
                logger.exception("receive failed; retrying", extra={"tier": tier})
                self._stopping.wait(RECEIVE_ERROR_BACKOFF_S)
