"""Slot accounting and the rate-sized prefetch of worker.receive.placement."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from worker.inflight import InFlight
from worker.receive.placement import RATE_WINDOW_S, Held, Placement


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def held(n: int) -> Held:
    message: dict[str, Any] = {"MessageId": f"m{n}", "ReceiptHandle": f"h{n}"}
    return message, InFlight(message_id=f"m{n}", receipt_handle=f"h{n}"), None


def test_slots_fill_then_buffer_and_a_release_hands_over_the_next() -> None:
    intake = Placement(2, horizon_s=0)
    assert intake.offer(held(1)) and intake.offer(held(2))
    assert not intake.offer(held(3)), "a third message waits in the buffer"
    assert (intake.busy, intake.buffered) == (2, 1)
    following = intake.release()
    assert following is not None and following[0]["MessageId"] == "m3"
    assert (intake.busy, intake.buffered) == (2, 0), "the slot went straight to m3"
    assert intake.release() is None and intake.busy == 1


def test_nothing_is_wanted_while_every_slot_is_busy_or_has_a_message_waiting() -> None:
    intake = Placement(2, horizon_s=0)
    assert intake.wait_wanted(0) == 2
    intake.offer(held(1))
    assert intake.wait_wanted(0) == 1
    intake.offer(held(2))
    assert intake.wait_wanted(0) == 0


def test_prefetch_follows_the_recent_start_rate_and_fades() -> None:
    clock = Clock()
    intake = Placement(4, horizon_s=1.0, clock=clock)
    assert intake.wait_wanted(0) == 4, "no history: ask for the free slots only"
    for n in range(4):
        intake.offer(held(n))
    # Ten starts per second for a while: one second of horizon is ten messages, capped at
    # the slot count.
    for n in range(4, 40):
        clock.now += 0.1
        intake.offer(held(n))
        assert intake.release() is not None
    intake.drop_buffered()
    assert intake.release() is None, "one slot frees with nothing buffered"
    assert intake.wait_wanted(0) == 1 + 4
    clock.now += RATE_WINDOW_S + 1
    assert intake.wait_wanted(0) == 1, "no recent starts: no prefetch"


def test_filling_empty_slots_buys_no_prefetch_until_one_frees() -> None:
    """A fresh worker fills its slots at once: that says nothing about how soon one frees
    (agent tasks run for minutes), so nothing more is locked behind them meanwhile."""
    clock = Clock()
    intake = Placement(4, horizon_s=2.0, clock=clock)
    for n in range(4):
        clock.now += 0.05
        assert intake.offer(held(n))
    assert intake.wait_wanted(0) == 0, "every slot busy, none freed yet: nothing to ask"
    clock.now += 0.5
    assert intake.release() is None
    # One end in the first second, a horizon of two: the free slot and two more.
    assert intake.wait_wanted(0) == 1 + 2


def test_a_message_is_surplus_once_the_slots_are_full_and_the_prefetch_is_held() -> None:
    clock = Clock()
    intake = Placement(1, horizon_s=2.0, clock=clock)
    assert not intake.surplus(), "a free slot"
    assert intake.offer(held(1))
    assert intake.surplus(), "busy, and no slot has freed yet: nothing is expected to start"
    clock.now += 0.5
    assert intake.release() is None and intake.offer(held(2))
    assert not intake.surplus(), "a slot freed lately: one may wait for the next"
    assert not intake.offer(held(3))
    assert intake.surplus(), "that place is taken"


def test_slow_starts_prefetch_nothing() -> None:
    clock = Clock()
    intake = Placement(3, horizon_s=1.0, clock=clock)
    for n in range(3):
        clock.now += 4.0  # a long task per slot: well under one start per second
        intake.offer(held(n))
    intake.release()
    assert intake.wait_wanted(0) == 1


def test_a_buffered_message_is_prepared_before_a_slot_can_take_it() -> None:
    intake = Placement(1, horizon_s=0)
    prepared: list[str] = []

    def prepare(item: Held) -> Held:
        prepared.append(item[0]["MessageId"])
        return item[0], item[1], Future()

    assert intake.offer(held(1), prepare=prepare), "a free slot starts it unprepared"
    assert not intake.offer(held(2), prepare=prepare)
    assert prepared == ["m2"]
    following = intake.release()
    assert following is not None and following[2] is not None


def test_drop_buffered_returns_what_never_started() -> None:
    intake = Placement(1, horizon_s=0)
    intake.offer(held(1))
    intake.offer(held(2))
    intake.offer(held(3))
    dropped = intake.drop_buffered()
    assert [m["MessageId"] for m, _, _ in dropped] == ["m2", "m3"]
    assert intake.release() is None and intake.wait_idle(0)


def _starting_ten_a_second(slots: int) -> Placement:
    """Every slot busy after a few seconds of ten starts a second, nothing buffered: the
    prefetch (one second of horizon) is capped at the slot count."""
    clock = Clock()
    intake = Placement(slots, horizon_s=1.0, clock=clock)
    for n in range(slots):
        intake.offer(held(n))
    for n in range(slots, slots + 36):
        clock.now += 0.1
        intake.offer(held(n))
        intake.release()
    intake.drop_buffered()
    return intake


def test_the_prefetch_is_refilled_before_it_runs_dry() -> None:
    intake = _starting_ten_a_second(2)
    intake.offer(held(99))
    assert (intake.busy, intake.buffered) == (2, 1)
    assert intake.wait_wanted(0) == 0, "one of two still buffered: no receive yet"
    assert intake.release() is not None
    assert (intake.busy, intake.buffered) == (2, 0)
    assert intake.wait_wanted(0) == 2, "every slot busy, but the buffer is empty: refill"


def test_a_hand_over_that_leaves_the_buffer_low_wakes_the_waiting_receiver() -> None:
    intake = _starting_ten_a_second(4)
    for n in range(4):
        intake.offer(held(100 + n))
    assert intake.wait_wanted(0) == 0, "a full prefetch: nothing wanted"
    answers: list[int] = []
    receiver = threading.Thread(target=lambda: answers.append(intake.wait_wanted(30)))
    receiver.start()
    for _ in range(3):
        assert intake.release() is not None  # four buffered, one left: below half
    receiver.join(timeout=10)
    # Without the wake-up the receiver would sleep out its 30 s wait.
    assert not receiver.is_alive(), "the receiver was not woken"
    assert answers == [3]


def tiered(n: int, tier: str, waited_s: float) -> Held:
    message: dict[str, Any] = {"MessageId": f"m{n}", "ReceiptHandle": f"h{n}"}
    entry = InFlight(message_id=f"m{n}", receipt_handle=f"h{n}", tier=tier)
    entry.received_at -= waited_s
    return message, entry, None


def _hand_over_order(overtake_after_s: float | None, low_waited_s: float) -> list[str]:
    intake = Placement(1, horizon_s=0, ranks={"high": 0, "low": 1},
                    overtake_after_s=overtake_after_s)  # fmt: skip
    assert intake.offer(tiered(0, "high", 0))
    intake.offer(tiered(1, "low", low_waited_s))
    intake.offer(tiered(2, "high", 0))
    order = []
    while (following := intake.release()) is not None:
        order.append(following[0]["MessageId"])
    return order


def test_strict_mode_never_lets_a_buffered_low_message_overtake_a_high_one() -> None:
    assert _hand_over_order(None, low_waited_s=60) == ["m2", "m1"]


def test_weighted_mode_lets_a_low_message_buffered_past_the_bound_go_first() -> None:
    assert _hand_over_order(1.0, low_waited_s=2) == ["m1", "m2"]
    assert _hand_over_order(1.0, low_waited_s=0) == ["m2", "m1"], "not yet starving"


def test_a_message_received_on_its_tiers_starvation_turn_takes_the_next_slot() -> None:
    intake = Placement(1, horizon_s=0, ranks={"high": 0, "low": 1}, overtake_after_s=30.0)
    assert intake.offer(tiered(0, "high", 0))
    turn = tiered(1, "low", 0)
    turn[1].starving = True
    intake.offer(tiered(2, "high", 0))
    intake.offer(turn)
    order = []
    while (following := intake.release()) is not None:
        order.append(following[0]["MessageId"])
    # Buffered for no time at all, it still goes before the high message ahead of it.
    assert order == ["m1", "m2"]
