"""The intake's per-tier rooms, buffer order and watched tiers' reserves (worker.receive.placement)."""

from __future__ import annotations

from typing import Any

from _scheduler_tiers import TIERS
from hypothesis import given
from hypothesis import strategies as st

from worker.inflight import InFlight
from worker.receive.placement import Held, Placement


# -- the intake's rooms and buffer order ---------------------------------------------------
def held(n: int, tier: str) -> Held:
    message: dict[str, Any] = {"MessageId": f"m{n}", "ReceiptHandle": f"h{n}"}
    return message, InFlight(message_id=f"m{n}", receipt_handle=f"h{n}", tier=tier), None


RANKS = {tier: rank for rank, tier in enumerate(TIERS)}


@given(
    size=st.integers(min_value=1, max_value=16),
    busy=st.integers(min_value=0, max_value=16),
    wanted=st.integers(min_value=0, max_value=10),
)
def test_lower_tiers_leave_prefetch_places_to_higher_ones(
    size: int, busy: int, wanted: int
) -> None:
    intake = Placement(size, horizon_s=0, ranks=RANKS)
    for n in range(min(busy, size)):
        intake.offer(held(n, "low"))
    rooms = intake.rooms(wanted, TIERS)
    idle = size - min(busy, size)
    assert rooms["high"] == wanted, "the highest tier may always fill what is wanted"
    assert rooms["high"] >= rooms["normal"] >= rooms["low"]
    assert rooms["low"] >= min(wanted, idle), "free slots are open to every tier"
    if wanted > idle:
        assert rooms["low"] == min(wanted, idle + max(1, wanted - idle - RANKS["low"]))


def test_a_freed_slot_takes_the_highest_buffered_tier_first() -> None:
    intake = Placement(1, horizon_s=0, ranks=RANKS)
    assert intake.offer(held(0, "low"))
    for n, tier in enumerate(("low", "normal", "high", "low"), start=1):
        assert not intake.offer(held(n, tier))
    order = []
    while (following := intake.release()) is not None:
        order.append(following[1].tier)
    assert order == ["high", "normal", "low", "low"]


def test_an_in_hand_message_of_the_highest_tier_is_never_overtaken() -> None:
    now = [0.0]
    intake = Placement(1, horizon_s=0, ranks=RANKS, clock=lambda: now[0])
    assert intake.offer(held(0, "low"))
    old = held(1, "low")
    old[1].received_at -= 60  # buffered long past the age rule
    for message in (old, held(2, "high"), held(3, "normal")):
        assert not intake.offer(message)
    order = []
    while (following := intake.release()) is not None:
        order.append(following[1].message_id)
    assert order == ["m2", "m1", "m3"], "high first; then the aged low before normal"


def test_a_watched_tier_may_ask_for_free_slots_and_its_reserve_less_what_it_holds() -> None:
    intake = Placement(2, horizon_s=0, ranks=RANKS)
    assert intake.wait_watch("high", 2, timeout_s=0) == (2, 0), "idle: the free slots"
    assert intake.offer(held(0, "low")) and intake.offer(held(1, "low"))
    # Low work only runs: the next slot to free here is free, another worker's may be
    # free now. A high message held here would wait for the hand-over.
    assert intake.wait_watch("high", 2, timeout_s=0) == (0, 0), "slots busy, nothing waiting"
    assert not intake.offer(held(3, "low"))
    assert intake.wait_watch("high", 2, timeout_s=0) == (2, 2), "a low message waits: the reserve"
    assert not intake.offer(held(2, "high"))
    assert intake.wait_watch("high", 2, timeout_s=0) == (1, 1)
    assert not intake.offer(held(4, "high"))
    assert intake.wait_watch("high", 2, timeout_s=0) == (0, 0), "its reserve is in hand"
    assert intake.wait_watch("normal", 1, timeout_s=0) == (1, 1), "each tier has its own"


def test_without_lower_tier_work_in_hand_a_busy_worker_reserves_nothing() -> None:
    intake = Placement(2, horizon_s=0, ranks=RANKS)
    assert intake.offer(held(0, "normal")) and intake.offer(held(1, "normal"))
    # Holding another normal task would only keep it from a worker that may be idle.
    assert intake.wait_watch("normal", 1, timeout_s=0) == (0, 0)
    assert intake.wait_watch("high", 2, timeout_s=0) == (0, 0), "the next freed slot is open to it"
    assert intake.release() is None
    assert intake.wait_watch("normal", 1, timeout_s=0) == (1, 0), "a free slot is open"
    assert intake.offer(held(2, "low"))
    assert intake.wait_watch("normal", 1, timeout_s=0) == (0, 0), "low work running only"
    assert not intake.offer(held(3, "low"))
    assert intake.wait_watch("normal", 1, timeout_s=0) == (1, 1), "low work waiting: the reserve"
    following = intake.release()
    assert following is not None and following[1].tier == "low", "what the reserve is for"
