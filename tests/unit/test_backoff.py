"""The one backoff: exponential from its base, capped, jittered below the bound, and
the retry loop that waits it out only for the errors it is told to retry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.backoff import compute_backoff, retry, retry_entries


@given(attempt=st.integers(0, 40), base=st.floats(0.001, 1.0), cap=st.floats(0.01, 5.0))
def test_a_pause_stays_below_its_exponential_bound_and_the_cap(
    attempt: int, base: float, cap: float
) -> None:
    bound = min(cap, base * 2**attempt)
    assert 0 <= compute_backoff(attempt, base_s=base, cap_s=cap) <= bound
    assert compute_backoff(attempt, base_s=base, cap_s=cap, jitter=False) == bound


class Conflict(Exception):
    pass


def test_retry_waits_between_tries_and_returns_the_first_success() -> None:
    pauses: list[float] = []
    answers: Iterator[Exception | str] = iter([Conflict(), Conflict(), "done"])

    def call() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = retry(call, retryable=lambda e: isinstance(e, Conflict), attempts=5,
                   base_s=0.1, cap_s=1.0, sleep=pauses.append)  # fmt: skip
    assert result == "done"
    assert len(pauses) == 2
    assert 0 <= pauses[0] <= 0.1 and 0 <= pauses[1] <= 0.2


def test_retry_raises_at_once_what_it_is_not_told_to_retry() -> None:
    pauses: list[float] = []

    def call() -> None:
        raise ValueError("not a conflict")

    with pytest.raises(ValueError):
        retry(call, retryable=lambda e: isinstance(e, Conflict), attempts=5, base_s=0.1,
              sleep=pauses.append)  # fmt: skip
    assert pauses == []


def test_retry_raises_the_last_error_when_its_attempts_are_spent() -> None:
    pauses: list[float] = []
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise Conflict(len(calls))

    with pytest.raises(Conflict) as raised:
        retry(call, retryable=lambda e: isinstance(e, Conflict), attempts=3, base_s=0.1,
              sleep=pauses.append)  # fmt: skip
    assert raised.value.args == (3,)
    assert len(pauses) == 2


@given(
    # For each entry, how many calls fail it before one takes it (-1: never), and whether
    # its failure may be retried.
    plan=st.lists(st.tuples(st.integers(-1, 4), st.booleans()), max_size=10),
    attempts=st.integers(1, 4),
)
def test_retry_entries_sends_again_only_retryable_failures_until_the_attempts_are_spent(
    plan: list[tuple[int, bool]], attempts: int
) -> None:
    calls: list[list[int]] = []
    pauses: list[float] = []

    def send(entries: list[int]) -> list[tuple[int, bool]]:
        calls.append(entries)
        number = len(calls)
        return [(e, plan[e][1]) for e in entries if plan[e][0] == -1 or number <= plan[e][0]]

    given_up = retry_entries(send, list(range(len(plan))), retryable=lambda why: why,
                             attempts=attempts, base_s=0.01, sleep=pauses.append)  # fmt: skip

    def outcome(fails: int, retryable: bool) -> tuple[int, bool]:
        """(calls that carry the entry, whether it is given up)"""
        if fails == 0:
            return 1, False
        if not retryable:
            return 1, True
        if fails == -1 or fails >= attempts:
            return attempts, True
        return fails + 1, False

    expected = [outcome(*p) for p in plan]
    assert [sum(e in c for c in calls) for e in range(len(plan))] == [n for n, _ in expected]
    assert sorted(e for e, _ in given_up) == [e for e, (_, up) in enumerate(expected) if up]
    assert all(why == plan[e][1] for e, why in given_up)
    assert len(pauses) == max(0, len(calls) - 1) and all(0 <= p <= 0.01 * 2**4 for p in pauses)
    assert all(calls), "never a call with nothing to send"
    assert calls or not plan
