"""`with_retry`: a few attempts inside the child, only for failures worth repeating.

Exponential backoff with full jitter (sleep a uniform random time in
``[0, min(cap, base * 2**(n-1))]``) so a fleet of children hit by one 429 spread their
retries out. Only the retryable categories of the taxonomy are retried; the last
failure is raised as a `TaskError` carrying its category, so the worker decides between
an SQS-level retry and a terminal failure. Each attempt runs under its own deadline:
a timeout is a cancellation, classified as ``timeout``.

Not tenacity: every attempt is classified once and reported with its next delay (or
none) to ``on_failure``, under an anyio deadline, with an injectable random source;
in tenacity that is a retry predicate, a wait, a sleep, a before-sleep and a final
callback sharing state, which is more code than this loop and one more child import.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from agentq.taxonomy import ErrorInfo, info

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 3
    base_s: float = 2.0
    cap_s: float = 30.0
    attempt_timeout_s: float | None = None

    def backoff(self, failed_attempts: int, rng: random.Random) -> float:
        ceiling = min(self.cap_s, self.base_s * 2 ** (failed_attempts - 1))
        return rng.uniform(0, ceiling)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One failed attempt, as reported to `on_failure`."""

    attempt: int
    error: ErrorInfo
    retry_in_s: float | None  # None: no further attempt


async def with_retry(
    operation: Callable[[int], Awaitable[T]],
    *,
    policy: RetryPolicy,
    classify: Callable[[BaseException], ErrorInfo],
    on_failure: Callable[[Failure], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run ``operation(attempt)`` until it succeeds, fails for good, or attempts run out."""
    rng = rng or random.Random()
    for attempt in range(1, policy.attempts + 1):
        try:
            if policy.attempt_timeout_s is None:
                return await operation(attempt)
            with anyio.fail_after(policy.attempt_timeout_s):
                return await operation(attempt)
        except TimeoutError as exc:
            error = (
                info(
                    "timeout",
                    f"attempt {attempt} exceeded {policy.attempt_timeout_s:g} s",
                    "TimeoutError",
                )
                if not str(exc)
                else classify(exc)
            )
        except Exception as exc:
            error = classify(exc)
        last = attempt == policy.attempts or not error.retryable
        delay = None if last else policy.backoff(attempt, rng)
        if on_failure is not None:
            on_failure(Failure(attempt=attempt, error=error, retry_in_s=delay))
        if delay is None:
            raise error.to_exception() from None
        await anyio.sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")
