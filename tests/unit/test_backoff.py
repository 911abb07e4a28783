"""The one backoff: exponential from its base, capped, jittered below the bound, and
the retry loop that waits it out only for the errors it is told to retry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.backoff import compute_backoff, retry


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
