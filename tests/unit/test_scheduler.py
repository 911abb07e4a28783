"""The priority scheduler's policy (worker.scheduler) and the intake's per-tier rooms."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.inflight import InFlight
from worker.intake import Held, Intake
from worker.scheduler import MODES, Scheduler

TIERS = ("high", "normal", "low")
backlogs = st.lists(st.integers(min_value=0, max_value=1000), min_size=3, max_size=3)


def scheduler(mode: str, **kwargs: Any) -> Scheduler:
    return Scheduler(tiers=TIERS, mode=mode, **kwargs)  # type: ignore[arg-type]


@given(counts=backlogs, now=st.floats(min_value=0, max_value=1e6))
def test_strict_never_picks_a_lower_tier_while_a_higher_one_has_work(
    counts: list[int], now: float
) -> None:
    chooser = scheduler("strict")
    chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=now)
    pick = chooser.pick(now)
    assert pick is not None
    with_work = [tier for tier, count in zip(TIERS, counts, strict=True) if count > 0]
    if with_work:
        assert pick.tier == with_work[0]
        assert pick.wait_s == 1, "a known backlog is a short long-poll, never a 20 s wait"
    else:
        assert pick.wait_s >= 1, "every tier empty: a long poll, not a busy loop"


@settings(max_examples=60)
@given(
    steps=st.lists(st.floats(min_value=0.01, max_value=2.0), min_size=50, max_size=300),
    bound=st.floats(min_value=1.0, max_value=20.0),
    counts=st.lists(st.integers(min_value=1, max_value=10_000), min_size=3, max_size=3),
)
def test_weighted_never_starves_a_tier_with_work_past_its_bound(
    steps: list[float], bound: float, counts: list[int]
) -> None:
    chooser = scheduler("weighted", starvation_s=bound)
    now = 0.0
    last = dict.fromkeys(TIERS, 0.0)
    for step in steps:
        now += step
        # Every tier keeps a backlog (a flood everywhere): the high tier always scores
        # highest, so only the bound lets the others in.
        chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=now)
        pick = chooser.pick(now)
        assert pick is not None
        for tier in TIERS:
            # A tier overdue waits at most for the other overdue tiers' turns.
            assert now - last[tier] <= bound + len(TIERS) * max(steps), tier
        last[pick.tier] = now


@given(rounds=st.integers(min_value=1, max_value=30), counts=backlogs)
def test_round_robin_gives_every_tier_with_work_its_turn(rounds: int, counts: list[int]) -> None:
    chooser = scheduler("round-robin")
    with_work = [tier for tier, count in zip(TIERS, counts, strict=True) if count > 0]
    picked: list[str] = []
    for n in range(rounds * max(1, len(with_work))):
        chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=float(n))
        pick = chooser.pick(float(n))
        assert pick is not None
        picked.append(pick.tier)
    if with_work:
        assert sorted(picked) == sorted(with_work * rounds), "each tier exactly its share"


def test_weighted_scores_follow_the_seed_examples() -> None:
    chooser = scheduler("weighted")
    chooser.refreshed({"high": 10, "normal": 20, "low": 50}, now=100.0)
    chooser.state["high"].last_poll = 95.0
    chooser.state["normal"].last_poll = 40.0
    chooser.state["low"].last_poll = 98.0
    chooser.state["low"].polls = 15
    assert chooser.score("high", 100.0) == pytest.approx(116_667, rel=1e-3)
    # The seed's prose caps the medium tier's boost at 1.5, but its formula (1 + level/2,
    # level 2) gives 2.0; agentq follows the formula (docs/scheduling.md).
    assert chooser.score("normal", 100.0) == pytest.approx(15 * 1000 * 2.0)
    assert chooser.score("low", 100.0) == pytest.approx(2_533, rel=1e-3)
    chooser.starvation_s = 120.0
    pick = chooser.pick(100.0)
    assert pick is not None and pick.tier == "high", "the highest score wins"


def test_weighted_gives_a_tier_past_the_starvation_bound_its_turn() -> None:
    chooser = scheduler("weighted", starvation_s=30.0)
    chooser.refreshed({"high": 10, "normal": 20, "low": 50}, now=0.0)
    chooser.state["high"].last_poll = 95.0
    chooser.state["normal"].last_poll = 40.0
    chooser.state["low"].last_poll = 98.0
    pick = chooser.pick(100.0)
    assert pick is not None and pick.tier == "normal", "not polled for 60 s > 30 s"


def test_a_full_batch_keeps_a_backlog_and_a_short_one_empties_it_until_the_probe() -> None:
    chooser = scheduler("strict", probe_s=1.0)
    chooser.refreshed({"high": 0, "normal": 0, "low": 30}, now=0.0)
    chooser.received("low", asked=10, got=10, now=0.0)
    assert chooser.state["low"].backlog == 20
    chooser.received("low", asked=10, got=10, now=0.0)
    chooser.received("low", asked=10, got=10, now=0.0)
    assert chooser.state["low"].backlog == 1, "a full batch: more may be there"
    chooser.received("low", asked=10, got=3, now=0.0)
    assert chooser.state["low"].backlog == 0
    pick = chooser.pick(0.5)
    assert pick is not None and pick.wait_s > 1, "all believed empty: an idle long poll"
    pick = chooser.pick(1.5)
    assert pick is not None and pick.tier == "high" and pick.probe and pick.wait_s == 0


def test_idle_polls_take_turns_so_no_tier_goes_unwatched() -> None:
    chooser = scheduler("strict", idle_wait_s=20)
    chooser.refreshed({"high": 0, "normal": 0, "low": 0}, now=0.0)
    picks = [chooser.pick(0.1) for _ in range(3)]
    assert [p.tier for p in picks if p] == list(TIERS)
    assert all(p is not None and p.wait_s == 6 for p in picks)


def test_a_tier_without_room_is_not_received_from() -> None:
    chooser = scheduler("strict")
    chooser.refreshed({"high": 5, "normal": 5, "low": 5}, now=0.0)
    pick = chooser.pick(0.0, {"high": 0, "normal": 0, "low": 2})
    assert pick is not None and pick.tier == "low"
    assert chooser.pick(0.0, dict.fromkeys(TIERS, 0)) is None


def test_one_queue_long_polls_as_a_single_queue_worker_always_has() -> None:
    chooser = Scheduler(tiers=("normal",), idle_wait_s=20)
    for now in (0.0, 5.0):
        pick = chooser.pick(now)
        assert pick is not None and (pick.tier, pick.wait_s) == ("normal", 20)
        chooser.received("normal", asked=3, got=3, now=now)


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError):
        Scheduler(tiers=())
    with pytest.raises(ValueError):
        Scheduler(tiers=("a", "a"))
    with pytest.raises(ValueError):
        Scheduler(tiers=("a",), mode="fastest")  # type: ignore[arg-type]
    assert set(MODES) == {"strict", "weighted", "round-robin"}


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
    intake = Intake(size, horizon_s=0, ranks=RANKS)
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
    intake = Intake(1, horizon_s=0, ranks=RANKS)
    assert intake.offer(held(0, "low"))
    for n, tier in enumerate(("low", "normal", "high", "low"), start=1):
        assert not intake.offer(held(n, tier))
    order = []
    while (following := intake.release()) is not None:
        order.append(following[1].tier)
    assert order == ["high", "normal", "low", "low"]
