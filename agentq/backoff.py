"""How long agentq waits before asking AWS again, and the retry loop that waits so.

Every retry of a call AWS refused for now (a transaction conflict, unprocessed keys,
failed event entries) waits `compute_backoff(attempt, ...)`: exponential from `base_s`,
at most `cap_s`, drawn uniformly below that bound ("full jitter") unless the caller
asks for the bound itself. `retry` runs a call until it succeeds, fails for a reason
that is not worth retrying, or has used its attempts; `retry_entries` sends again the
entries a batch call failed inside its answer (SQS `Failed`, PutEvents' `ErrorCode`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
F = TypeVar("F")


def compute_backoff(
    attempt: int, *, base_s: float, cap_s: float = math.inf, jitter: bool = True
) -> float:
    """The pause before try `attempt + 1` (attempt counts from 0)."""
    bound = min(cap_s, base_s * 2**attempt)
    return random.uniform(0, bound) if jitter else bound


def retry(
    call: Callable[[], T],
    *,
    retryable: Callable[[Exception], bool],
    attempts: int,
    base_s: float,
    cap_s: float = math.inf,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, again after an exception `retryable` accepts; the last one is raised."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:
            if not retryable(error) or attempt == attempts - 1:
                raise
            sleep(compute_backoff(attempt, base_s=base_s, cap_s=cap_s))
    raise AssertionError("unreachable")  # pragma: no cover


def retry_entries(
    send: Callable[[list[T]], list[tuple[T, F]]],
    entries: list[T],
    *,
    retryable: Callable[[F], bool],
    attempts: int,
    base_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> list[tuple[T, F]]:
    """`send(entries)`, which answers the entries that failed with why; those `retryable`
    accepts go again after `compute_backoff(n)` (n = 1, 2, ...), until none fails or
    `attempts` calls are made. What still failed, with why."""
    if not entries:
        return []
    given_up: list[tuple[T, F]] = []
    pending = entries
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            sleep(compute_backoff(attempt - 1, base_s=base_s))
        failed, pending = send(pending), []
        for entry, why in failed:
            if attempt < attempts and retryable(why):
                pending.append(entry)
            else:
                given_up.append((entry, why))
        if not pending:
            break
    return given_up
