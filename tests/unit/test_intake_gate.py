"""Gated messages (a limited tenant's): locked before they take a slot, worker.receive.placement."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from support import wait_for

from worker.inflight import InFlight
from worker.receive.placement import Held, Placement

NEVER = 600.0


@contextmanager
def gate_threads(intake: Placement, count: int) -> Iterator[ThreadPoolExecutor]:
    """The gate pool's threads; no parked message outlives a failed assertion."""
    with ThreadPoolExecutor(count) as pool:
        try:
            yield pool
        finally:
            intake.seats.close()


def held(n: int, tier: str | None = None) -> Held:
    message: dict[str, Any] = {"MessageId": f"m{n}", "ReceiptHandle": f"h{n}"}
    entry = InFlight(message_id=f"m{n}", receipt_handle=f"h{n}", tier=tier)
    return message, entry, Future()


def test_a_pending_gate_holds_no_slot_another_message_takes_it() -> None:
    intake = Placement(1, horizon_s=0)
    gated = held(1)
    intake.gate(gated)
    # The receiver asks nothing more on its account...
    assert intake.wait_wanted(0) == 0
    # ...but a message that arrives meanwhile takes the free slot.
    assert intake.offer(held(2)), "the free slot went to the ungated message"
    assert (intake.busy, intake.buffered) == (1, 1)


def test_a_refused_gate_is_settled_without_a_slot() -> None:
    intake = Placement(2, horizon_s=0)
    gated = held(1)
    intake.gate(gated)
    assert intake.settle_gate(gated, runnable=False) == "settle"
    assert (intake.busy, intake.buffered) == (0, 0)
    assert intake.wait_wanted(0) == 2, "its buffer place is free again"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_locked_gate_takes_a_free_slot_or_waits_for_the_next() -> None:
    # A slot freed within the last second, a horizon of one second: one message may wait
    # for a slot.
    intake = Placement(1, horizon_s=1.0, clock=Clock())
    assert intake.offer(held(0)) and intake.release() is None
    first, second = held(1), held(2)
    intake.gate(first)
    intake.gate(second)
    assert intake.settle_gate(first, runnable=True) == "start"
    assert intake.busy == 1
    assert intake.settle_gate(second, runnable=True) == "wait", "every slot is busy"
    following = intake.release()
    assert following is not None and following[1] is second[1]


def test_a_release_never_hands_over_a_pending_gate() -> None:
    intake = Placement(1, horizon_s=0)
    assert intake.offer(held(1))
    gated = held(2)
    intake.gate(gated)
    assert intake.release() is None, "the slot frees rather than wait on the lock"
    assert (intake.busy, intake.buffered) == (0, 1)
    assert intake.settle_gate(gated, runnable=True) == "start"
    assert intake.busy == 1


def test_a_release_skips_a_pending_gate_for_a_ready_message_behind_it() -> None:
    intake = Placement(1, horizon_s=0)
    assert intake.offer(held(1))
    gated, ready = held(2), held(3)
    intake.gate(gated)
    assert not intake.offer(ready)
    following = intake.release()
    assert following is not None and following[1] is ready[1]


def test_a_drain_takes_pending_gates_and_their_decision_then_finds_them_gone() -> None:
    intake = Placement(2, horizon_s=0)
    gated = held(1)
    intake.gate(gated)
    assert [h[1] for h in intake.drop_buffered()] == [gated[1]]
    assert intake.settle_gate(gated, runnable=True) == "gone"
    assert intake.busy == 0


def test_a_watched_tier_may_ask_for_the_slot_a_pending_gate_waits_beside() -> None:
    intake = Placement(2, horizon_s=0, ranks={"high": 0, "low": 1})
    assert intake.offer(held(1, "low"))
    intake.gate(held(2, "low"))
    # One slot busy, one free, a lower-tier gate pending: high may ask for the free slot.
    # No reserve: the gate takes no slot that frees (a lock pending, or a seat: a
    # tenant's parked messages), so high would only be held here from another worker.
    assert intake.wait_watch("high", reserve=2, timeout_s=0) == (1, 0)
    intake.gate(held(3, "low"))
    assert intake.wait_watch("high", reserve=2, timeout_s=0) == (1, 0)
    assert intake.wait_wanted(0) == 0, "the receiver's free slot is spoken for"


def test_a_locked_gate_beyond_the_prefetch_is_handed_back_not_kept() -> None:
    """Long tasks (no prefetch): a locked message that lost its slot to another would
    hold its tenant's seat behind a whole task while another worker may idle."""
    intake = Placement(1, horizon_s=0)
    gated = held(1)
    intake.gate(gated)
    assert intake.offer(held(2)), "a watched tier's message took the free slot"
    assert intake.settle_gate(gated, runnable=True) == "surplus"
    assert (intake.busy, intake.buffered) == (1, 0)
    assert intake.release() is None


def test_parked_messages_hold_no_room_of_the_receivers() -> None:
    # Parked through the placement's own seat waits: one lock, one state per message.
    intake = Placement(3, horizon_s=0, park_retry_s=NEVER, park_s=NEVER)
    first, second = held(1), held(2)
    intake.gate(first)
    intake.gate(second)
    assert intake.wait_wanted(0) == 1, "pending locks hold their places"
    assert intake.rooms(1, ["only"]) == {"only": 1}
    with gate_threads(intake, 2) as pool:
        # Both refused a seat: their preparations park on the gate threads.
        wakes = [pool.submit(intake.seats.for_message(id(h[1])).park, tenant, time.monotonic())
                 for h, tenant in ((first, "acme"), (second, "beta"))]  # fmt: skip
        wait_for(lambda: intake.seats.parked == 2, timeout=10, message="both parked")
        assert intake.wait_wanted(0) == 3, "every slot is open to other work"
        assert intake.rooms(3, ["only"]) == {"only": 3}
        assert intake.offer(held(3)), "an arriving message takes a free slot"
        intake.seats.freed("acme")  # one takes a seat: pending its slot, it holds a place
        wait_for(lambda: intake.seats.parked == 1, timeout=10, message="one woke")
        assert intake.wait_wanted(0) == 1
        assert intake.settle_gate(first, runnable=True) == "start"
        assert (intake.busy, intake.buffered) == (2, 1)
        intake.seats.close()
        assert wakes[0].result(timeout=10) is not None, "the first took the seat freed here"
        assert wakes[1].result(timeout=10) is None, "the other stopped waiting at the close"


def test_a_message_dropped_by_a_drain_while_parked_is_gone() -> None:
    intake = Placement(1, horizon_s=0, park_retry_s=NEVER, park_s=NEVER)
    gated = held(1)
    intake.gate(gated)
    with gate_threads(intake, 1) as pool:
        wake = pool.submit(intake.seats.for_message(id(gated[1])).park, "acme", time.monotonic())
        wait_for(lambda: intake.seats.parked == 1, timeout=10, message="parked")
        assert intake.drop_buffered() == [gated]
        intake.seats.close()
        assert wake.result(timeout=10) is None
    assert intake.settle_gate(gated, runnable=False) == "gone"
    assert intake.buffered == 0
