"""Which priority tier the receiver asks next: the scheduler's policy, and nothing else.

No I/O and no clock of its own: the receiver tells it what each receive returned and
what a periodic `GetQueueAttributes` said, passes `now`, and asks `pick(now, room)`.
So it is tested as a pure function of those observations (tests/unit/test_scheduler_policy.py).

Backlog is an *estimate*, never a request per receive: a full batch means more is
probably there (the estimate drops by what was taken, but not below 1), a short or empty
batch means the visible backlog was drained (0), and `refreshed` sets it from the
queue's `ApproximateNumberOfMessages` at most every `SCHEDULER_BACKLOG_REFRESH`. A tier
believed empty becomes a *maybe* again after `probe_s`, and is then probed with a short
poll, so new high-priority work is found within about `probe_s` without an attributes
call. A tier believed empty that stays empty is probed less and less often (the interval
doubles per empty probe, up to `PROBE_BACKOFF_MAX` times `probe_s`), so a drained tier
costs few receives while another tier keeps the slots busy.

*Watched* tiers (every tier above the lowest, when there are several) have a long poll
of their own always outstanding in the receiver (worker/receive/tiers.py): a message arriving
there is in hand at once, so the scheduler never probes them and counts them as having
work only while their backlog is above zero (or not known yet). Nor does it long-poll
them: what arrives there is for the watchers, which ask for free slots only. The
receiver asks for its prefetch too, and a message its long poll caught on a busy worker
would wait there for a hand-over while another worker's watcher, with a free slot, was
waiting for it (docs/scheduling.md). So a watched tier's known backlog is a short poll
(what already waits), and when only watched tiers have room and none is believed to
have work, there is nothing to pick.

Modes:
- ``strict``: the highest tier that has (or may have) work, always.
- ``round-robin``: tiers that have (or may have) work, in turn.
- ``weighted``: seed 004's score, backlog * weight * priority multiplier (10^(level+1))
  * wait boost (1 + wait/30 s, capped at 1 + level/2), * 0.95 after more than 10
  consecutive polls of the same tier. The multiplier makes it strict in practice; the
  guarantee against starvation is the bound: a tier with work that has not been polled
  for `starvation_s` goes first (the longest-waiting such tier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

Mode = Literal["strict", "weighted", "round-robin"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)

WAIT_BOOST_FULL_S: Final = 30.0  # seed 004: the wait factor reaches its cap after this
POLL_PENALTY_AFTER: Final = 10  # consecutive polls of one tier before the penalty
POLL_PENALTY: Final = 0.95
# An empty tier's probe interval doubles per empty probe up to this many times probe_s:
# each probe of a drained tier is a receive that brings nothing back.
PROBE_BACKOFF_MAX: Final = 8


def default_weight(rank: int) -> float:
    """Seed 004's weights by rank (1.0, 0.75, 0.5), never below 0.25."""
    return max(0.25, 1.0 - 0.25 * rank)


@dataclass(frozen=True, kw_only=True)
class Pick:
    tier: str
    # 0: a short poll (the tier has, or may have, work); otherwise a long poll because
    # every tier is believed empty.
    wait_s: int
    probe: bool = False  # the tier was believed empty: this receive checks again
    # Weighted mode: the tier's starvation turn. What this receive brings must reach a
    # slot before any other tier's work (worker/receive/tiers.py, worker/receive/placement.py).
    overdue: bool = False


@dataclass
class TierState:
    name: str
    rank: int  # 0 is the highest priority
    weight: float
    backlog: float | None = None  # None: not known yet (counts as "may have work")
    empty_since: float | None = None
    last_poll: float = 0.0
    polls: int = 0  # receives from this tier since the last receive from another one
    empty_probes: int = 0  # probes in a row that found the tier still empty
    observed: float | None = None  # when a receive last told us this tier's backlog

    def level(self, tiers: int) -> int:
        """Seed 004's priority number: the lowest tier is 1, the highest `tiers`."""
        return tiers - self.rank


@dataclass
class Scheduler:
    """One per worker; the receiver thread is its only caller (no lock needed)."""

    tiers: Sequence[str]  # highest priority first
    mode: Mode = "weighted"
    starvation_s: float = 30.0
    probe_s: float = 1.0
    idle_wait_s: int = 20
    weights: Mapping[str, float] = field(default_factory=dict)
    started: float = 0.0
    # Tiers with a long poll of their own outstanding: never probed (see the module doc).
    watched: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.tiers or len(set(self.tiers)) != len(self.tiers):
            raise ValueError("tiers must be distinct and at least one")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.state = {
            name: TierState(name=name, rank=rank,
                            weight=self.weights.get(name, default_weight(rank)),
                            last_poll=self.started)
            for rank, name in enumerate(self.tiers)
        }  # fmt: skip
        self._last: str | None = None
        self._idle_turn = 0

    # -- observations ----------------------------------------------------------------
    def received(self, tier: str, *, asked: int, got: int, now: float) -> None:
        """What one receive from `tier` returned."""
        state = self.state[tier]
        state.observed = now
        if got >= asked > 0:
            state.backlog = max((state.backlog or 0.0) - got, 1.0)
            state.empty_since = None
            state.empty_probes = 0
        else:
            if got == 0 and state.backlog is not None and state.backlog <= 0:
                state.empty_probes += 1  # a probe of a tier already believed empty
            elif got > 0:
                state.empty_probes = 0
            state.backlog = 0.0
            state.empty_since = now

    def refreshed(self, backlog: Mapping[str, int], *, now: float) -> None:
        """The queues' visible message counts (GetQueueAttributes)."""
        for tier, count in backlog.items():
            state = self.state.get(tier)
            if state is None:
                continue
            state.backlog = float(max(0, count))
            state.observed = now
            state.empty_since = None if count > 0 else now
            if count > 0:
                state.empty_probes = 0

    def stale(self, now: float, age_s: float) -> list[str]:
        """Unwatched tiers no receive or refresh has told us about for `age_s`: the only
        ones a backlog refresh needs to ask (the others' figures are fresh)."""
        return [
            t for t, state in self.state.items()
            if t not in self.watched and (state.observed is None or now - state.observed >= age_s)
        ]  # fmt: skip

    # -- the decision ----------------------------------------------------------------
    def has_work(self, tier: str, now: float) -> bool:
        """Known backlog, unknown, or believed empty for longer than its probe interval.

        A watched tier is never probed: its own long poll finds new arrivals, so it has
        work only while its backlog is known (or not known yet, at start)."""
        state = self.state[tier]
        if state.backlog is None or state.backlog > 0:
            return True
        if tier in self.watched:
            return False
        return state.empty_since is None or now - state.empty_since >= self.probe_interval(tier)

    def probe_interval(self, tier: str) -> float:
        """`probe_s`, doubled per empty probe in a row, at most PROBE_BACKOFF_MAX times."""
        doublings = min(self.state[tier].empty_probes, PROBE_BACKOFF_MAX.bit_length() - 1)
        return self.probe_s * (1 << doublings)

    def pick(self, now: float, room: Mapping[str, int] | None = None) -> Pick | None:
        """The tier to receive from now; None when no tier has room (`room[tier]` ≤ 0),
        or only watched tiers have, none of them believed to have work."""
        open_tiers = [t for t in self.tiers if room is None or room.get(t, 0) > 0]
        if not open_tiers:
            return None
        if len(self.tiers) == 1:
            # One queue: long-poll it, as a single-queue worker always has.
            return self._polled(Pick(tier=open_tiers[0], wait_s=self.idle_wait_s), now)
        candidates = [t for t in open_tiers if self.has_work(t, now)]
        if not candidates:
            # Every tier believed empty: long-poll the unwatched ones in turn, highest
            # first, each for a share of the wait, so new work on any tier is seen within
            # one wait (the watched tiers' own long polls see theirs at once).
            idle = [t for t in open_tiers if t not in self.watched]
            if not idle:
                return None  # only watched tiers are open: theirs are the watchers' polls
            unwatched = [t for t in self.tiers if t not in self.watched] or self.tiers
            tier = idle[self._idle_turn % len(idle)]
            self._idle_turn += 1
            wait = min(self.idle_wait_s, max(1, self.idle_wait_s // len(unwatched)))
            return self._polled(Pick(tier=tier, wait_s=wait), now)
        self._idle_turn = 0
        overdue = [t for t in self.overdue(now) if t in candidates]
        if overdue:
            tier = min(overdue, key=lambda t: (self.state[t].last_poll, self.state[t].rank))
        else:
            tier = self._choose(candidates, now)
        state = self.state[tier]
        probe = state.backlog is not None and state.backlog <= 0
        # A known backlog returns at once from a 1 s long poll (which, unlike a short
        # poll, asks every SQS server); a probe of a tier believed empty must not stall,
        # and a watched tier's new arrivals are its watcher's (module doc).
        wait_s = 0 if probe or tier in self.watched else 1
        return self._polled(Pick(tier=tier, wait_s=wait_s, probe=probe, overdue=bool(overdue)), now)

    def overdue(self, now: float) -> list[str]:
        """Weighted mode: the tiers with work past the starvation bound (they go next).

        The watched tiers' long polls pause while another tier is overdue: otherwise
        their messages, which take a freed slot first, would keep the receiver from
        ever making the overdue tier's turn."""
        if self.mode != "weighted":
            return []
        return [t for t in self.tiers
                if self.has_work(t, now) and now - self.state[t].last_poll >= self.starvation_s]  # fmt: skip

    def _choose(self, candidates: list[str], now: float) -> str:
        if self.mode == "strict":
            return candidates[0]  # tiers are in priority order
        if self.mode == "round-robin":
            if self._last is None or self._last not in self.tiers:
                return candidates[0]
            start = self.tiers.index(self._last) + 1
            order = [*self.tiers[start:], *self.tiers[:start]]
            return next(t for t in order if t in candidates)
        return max(candidates, key=lambda t: (self.score(t, now), -self.state[t].rank))

    def score(self, tier: str, now: float) -> float:
        """Seed 004's score for `tier` (weighted mode)."""
        state = self.state[tier]
        level = state.level(len(self.tiers))
        backlog = state.backlog if state.backlog is not None and state.backlog > 0 else 1.0
        multiplier = 10.0 ** (level + 1)
        wait = max(0.0, now - state.last_poll)
        boost = min(1.0 + wait / WAIT_BOOST_FULL_S, 1.0 + level * 0.5)
        penalty = POLL_PENALTY if state.polls > POLL_PENALTY_AFTER else 1.0
        return backlog * state.weight * multiplier * boost * penalty

    def _polled(self, pick: Pick, now: float) -> Pick:
        state = self.state[pick.tier]
        state.polls = state.polls + 1 if self._last == pick.tier else 1
        state.last_poll = now
        self._last = pick.tier
        return pick
