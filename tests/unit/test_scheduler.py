"""The priority scheduler's policy (worker.scheduler) and the intake's per-tier rooms."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.config import Settings
from agentq.envelope import DecodedBody, parse_message
from agentq.errors import InvalidInput
from worker.inflight import InFlight
from worker.intake import Held, Intake
from worker.scheduler import MODES, Scheduler
from worker.tiers import TierReceiver

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


def test_an_in_hand_message_of_the_highest_tier_is_never_overtaken() -> None:
    now = [0.0]
    intake = Intake(1, horizon_s=0, ranks=RANKS, clock=lambda: now[0])
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
    intake = Intake(2, horizon_s=0, ranks=RANKS)
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
    intake = Intake(2, horizon_s=0, ranks=RANKS)
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


# -- the forward check decodes a body once and hands it on ------------------------------------
priorities = st.sampled_from(["high", "normal", "low", "urgent", "HIGH", ""])
inputs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(priority=priorities, payload=inputs, as_event=st.booleans())
def test_the_forward_check_hands_on_the_body_it_decoded_and_the_parser_uses_it(
    priority: str, payload: Any, as_event: bool
) -> None:
    data: dict[str, Any] = {"requestId": "r-1", "definition": "sample-noop", "input": payload}
    if priority:
        data["priority"] = priority
    if as_event:
        data = {"detail-type": "Task Requested", "detail": data}
    text = json.dumps(data)
    settings_ = Settings(queue_url="https://q/normal",
                         queue_urls="high=https://q/high,normal=https://q/normal,low=https://q/low")  # fmt: skip
    receiver = TierReceiver(settings_, sqs=None)
    message: dict[str, Any] = {"Body": text, "ReceiptHandle": "h"}
    destination = receiver.destination(message, "normal")
    body = message["Body"]
    assert isinstance(body, DecodedBody) and body == text, "still the same text everywhere"
    assert body.data == data
    expected = {"high": "https://q/high", "low": "https://q/low"}.get(priority)
    assert destination == expected
    assert outcome(body) == outcome(text), "the decoded body parses as its text does"


def outcome(body: str) -> object:
    try:
        return parse_message(body, None, default_tenant="acme")
    except InvalidInput as exc:
        return str(exc)


def test_a_body_the_forward_check_cannot_decode_is_left_as_text() -> None:
    settings_ = Settings(
        queue_url="https://q/normal", queue_urls="high=https://q/high,normal=https://q/normal"
    )
    message: dict[str, Any] = {"Body": "[" * 10_000, "ReceiptHandle": "h"}
    assert TierReceiver(settings_, sqs=None).destination(message, "normal") is None
    assert not isinstance(message["Body"], DecodedBody)


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


def test_the_watchers_wait_while_a_starvation_turn_is_being_received() -> None:
    settings_ = Settings(
        queue_url="https://q/normal",
        queue_urls="high=https://q/high,normal=https://q/normal,low=https://q/low",
        starvation_bound_ms=1000,
    )
    now = [0.0]

    class Queues:
        def receive_message(self, **kwargs: Any) -> dict[str, Any]:
            # While low's turn is in the receive, no watcher may start a poll of its own.
            assert not receiver.may_watch("high") and not receiver.may_watch("normal")
            assert receiver.may_watch("low")
            return {"Messages": [{"MessageId": "m", "ReceiptHandle": "h", "Body": "{}"}]}

    receiver = TierReceiver(settings_, sqs=Queues(), clock=lambda: now[0])
    for tier in ("high", "normal"):
        receiver.scheduler.received(tier, asked=1, got=1, now=0.0)  # work: never idle
        receiver.scheduler.state[tier].last_poll = 5.0
    now[0] = 5.0  # low: never received from, past the 1 s bound
    pick, messages = receiver.receive({"high": 1, "normal": 1, "low": 1})
    assert pick is not None and pick.tier == "low" and pick.overdue and len(messages) == 1
    assert not receiver.may_watch("high"), "until the turn's message is in the intake"
    receiver.turn_taken()
    assert receiver.may_watch("high")


@given(
    counts=backlogs,
    mode=st.sampled_from(MODES),
    rooms=st.lists(st.integers(min_value=1, max_value=10), min_size=2, max_size=2),
)
def test_while_the_lowest_tier_cools_the_receiver_takes_only_a_known_watched_backlog(
    counts: list[int], mode: str, rooms: list[int]
) -> None:
    """With the lowest tier cooling (worker.cooling), what the receiver could poll is
    the watched tiers, whose arrivals are their watchers' (for free slots). So it picks
    one only for a backlog already known there, with a short poll; otherwise nothing."""
    chooser = scheduler(mode, watched=WATCHED, starvation_s=1e9)
    chooser.refreshed(dict(zip(TIERS, counts, strict=True)), now=0.0)
    pick = chooser.pick(5.0, {"high": rooms[0], "normal": rooms[1], "low": 0})
    known = [t for t, c in zip(TIERS, counts, strict=True) if c > 0 and t in WATCHED]
    if not known:
        assert pick is None, "no poll of a watched tier beside its watcher"
        return
    assert pick is not None and pick.tier in known and pick.wait_s == 0 and not pick.probe


def test_a_capped_receive_never_long_polls_past_the_cap() -> None:
    """While a tier cools (worker.cooling) the receiver may pick another; its long poll
    must end by the time the cooled tier opens again, not after an idle 20 s."""
    asked: list[int] = []

    class Sqs:
        def receive_message(self, **request: Any) -> dict[str, Any]:
            asked.append(request["WaitTimeSeconds"])
            return {}

    settings_ = Settings(queue_url="https://q/normal",
                         queue_urls="high=https://q/high,normal=https://q/normal,low=https://q/low")  # fmt: skip
    receiver = TierReceiver(settings_, sqs=Sqs())
    receiver.scheduler.refreshed(dict.fromkeys(TIERS, 0), now=time.monotonic())
    rooms = {"high": 1, "normal": 0, "low": 1}  # normal cools
    receiver.receive(rooms)
    receiver.receive(rooms, max_wait_s=2)
    assert asked[0] > 2, "uncapped, every open tier believed empty: a long idle poll"
    assert asked[1] <= 2


def test_a_starvation_turn_asks_for_a_message_per_slot_and_other_picks_for_their_room() -> None:
    """Under higher work a low tier's room is one place; its turn takes a slot's worth,
    so its share of a saturated fleet is not one task per worker per bound."""
    asked: dict[str, list[int]] = {"high": [], "low": []}

    class Sqs:
        def receive_message(self, **request: Any) -> dict[str, Any]:
            tier = request["QueueUrl"].rsplit("/", 1)[1]
            asked[tier].append(request["MaxNumberOfMessages"])
            body = {"MessageId": "m", "ReceiptHandle": "h", "Body": "{}"}
            return {"Messages": [body] * request["MaxNumberOfMessages"]}

    settings_ = Settings(queue_url="https://q/high", queue_urls="high=https://q/high,low=https://q/low",
                         starvation_bound_ms=1000, max_concurrent=4)  # fmt: skip
    now = [0.0]
    receiver = TierReceiver(settings_, sqs=Sqs(), clock=lambda: now[0])
    receiver.scheduler.received("high", asked=1, got=1, now=0.0)
    receiver.scheduler.state["high"].last_poll = 5.0
    rooms = {"high": 2, "low": 1}
    now[0] = 5.0  # low never received from: past its 1 s bound
    turn, _ = receiver.receive(rooms)
    receiver.turn_taken()
    following, _ = receiver.receive(rooms)
    assert turn is not None and turn.tier == "low" and turn.overdue
    assert following is not None and following.tier == "high" and not following.overdue
    assert asked == {"high": [2], "low": [4]}
