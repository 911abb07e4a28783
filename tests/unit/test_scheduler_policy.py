"""The priority scheduler's policy (worker.scheduler): its modes, probes and watched tiers."""

from __future__ import annotations

from typing import Any

import pytest
from _scheduler_tiers import TIERS
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.scheduler import MODES, Scheduler

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


# -- watched tiers, probe back-off, stale refreshes -----------------------------------------
WATCHED = frozenset(TIERS[:-1])


@given(
    counts=backlogs,
    now=st.floats(min_value=0, max_value=1e6),
    mode=st.sampled_from(MODES),
    later=st.floats(min_value=0, max_value=1e4),
)
def test_a_watched_tier_is_never_probed_and_goes_first_once_its_backlog_is_known(
    counts: list[int], now: float, mode: str, later: float
) -> None:
    chooser = scheduler(mode, watched=WATCHED, starvation_s=1e9)
    chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=now)
    pick = chooser.pick(now + later)
    assert pick is not None
    if pick.tier in WATCHED:
        # Its own long poll finds arrivals: the receiver only takes a known backlog, with
        # a short poll (a long one would catch arrivals meant for other workers' slots).
        assert counts[TIERS.index(pick.tier)] > 0 and not pick.probe
        assert pick.wait_s == 0
    elif counts[TIERS.index(pick.tier)] > 0:
        assert pick.wait_s == 1, "an unwatched tier's known backlog: a 1 s long poll"
    if mode == "strict":
        known = [t for t, c in zip(TIERS, counts, strict=True) if c > 0 and t in WATCHED]
        if known:
            assert pick.tier == known[0], "a known high backlog goes before the low tier"
    if not any(counts):
        # Everything empty: the idle long poll is on the unwatched tier only, for the
        # whole wait (the watched ones have their own).
        assert pick.tier == "low" and (pick.wait_s == 0 or pick.wait_s == chooser.idle_wait_s)


@settings(max_examples=60)
@given(
    steps=st.lists(st.floats(min_value=0.01, max_value=2.0), min_size=50, max_size=300),
    bound=st.floats(min_value=1.0, max_value=20.0),
    counts=st.lists(st.integers(min_value=1, max_value=10_000), min_size=3, max_size=3),
)
def test_weighted_with_watched_tiers_still_honours_the_starvation_bound(
    steps: list[float], bound: float, counts: list[int]
) -> None:
    chooser = scheduler("weighted", starvation_s=bound, watched=WATCHED)
    now = 0.0
    last = dict.fromkeys(TIERS, 0.0)
    for step in steps:
        now += step
        chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=now)
        pick = chooser.pick(now)
        assert pick is not None
        for tier in TIERS:
            assert now - last[tier] <= bound + len(TIERS) * max(steps), tier
        last[pick.tier] = now


@given(probes=st.integers(min_value=0, max_value=20))
def test_an_empty_tier_is_probed_less_often_the_longer_it_stays_empty(probes: int) -> None:
    chooser = scheduler("strict", probe_s=1.0, watched=WATCHED)
    chooser.refreshed({"high": 0, "normal": 0, "low": 0}, now=0.0)
    now = 0.0
    intervals = []
    for _ in range(probes):
        interval = chooser.probe_interval("low")
        intervals.append(interval)
        now += interval
        assert chooser.has_work("low", now) and not chooser.has_work("low", now - 0.01)
        chooser.received("low", asked=4, got=0, now=now)
    assert intervals == sorted(intervals), "the interval only grows while nothing comes"
    assert all(1.0 <= i <= 8.0 for i in intervals)
    chooser.received("low", asked=4, got=2, now=now)
    assert chooser.probe_interval("low") == 1.0, "work found: probed at the full rate again"


def test_a_refresh_asks_only_the_unwatched_tiers_that_no_receive_renewed() -> None:
    chooser = scheduler("weighted", watched=WATCHED)
    assert chooser.stale(0.0, 10.0) == ["low"], "never observed: stale"
    chooser.received("low", asked=10, got=10, now=5.0)
    assert chooser.stale(14.0, 10.0) == [], "a receive 9 s ago is fresh"
    assert chooser.stale(15.0, 10.0) == ["low"]
    assert scheduler("weighted").stale(0.0, 10.0) == list(TIERS)


# -- starvation turns, and a lowest tier with no room---------------------------------------
@given(mode=st.sampled_from(MODES), waited=st.floats(min_value=0, max_value=100))
def test_only_weighted_mode_has_overdue_tiers_and_a_turn_ends_it(mode: str, waited: float) -> None:
    chooser = scheduler(mode, starvation_s=30.0, watched=WATCHED)
    chooser.refreshed({"high": 50, "normal": 0, "low": 50}, now=waited)
    overdue = chooser.overdue(waited)
    if mode != "weighted" or waited < 30.0:
        assert overdue == []
        return
    # Both have work (normal is watched and known empty): the watchers pause for low.
    assert overdue == ["high", "low"]
    chooser.state["high"].last_poll = waited
    pick = chooser.pick(waited)
    assert pick is not None and pick.tier == "low" and chooser.overdue(waited) == []
    assert pick.overdue, "the pick is low's starvation turn"
    following = chooser.pick(waited)
    assert following is not None and not following.overdue


@given(
    counts=backlogs,
    mode=st.sampled_from(MODES),
    rooms=st.lists(st.integers(min_value=1, max_value=10), min_size=2, max_size=2),
)
def test_with_no_room_on_the_lowest_tier_the_receiver_takes_only_a_known_watched_backlog(
    counts: list[int], mode: str, rooms: list[int]
) -> None:
    """With no room on the lowest tier, what the receiver could poll is the watched
    tiers, whose arrivals are their watchers' (for free slots). So it picks
    one only for a backlog already known there, with a short poll; otherwise nothing."""
    chooser = scheduler(mode, watched=WATCHED, starvation_s=1e9)
    chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=0.0)
    pick = chooser.pick(5.0, {"high": rooms[0], "normal": rooms[1], "low": 0})
    known = [t for t, c in zip(TIERS, counts, strict=True) if c > 0 and t in WATCHED]
    if not known:
        assert pick is None, "no poll of a watched tier beside its watcher"
        return
    assert pick is not None and pick.tier in known and pick.wait_s == 0 and not pick.probe
