"""When a delayed task may run: parsing `delay` / `not_before` from producers.

A producer gives at most one of:
- `delay`: seconds from now (a number, 0 … one year: MAX_DELAY_S, 366 days);
- `not_before` (at most a year ahead as well): an ISO 8601 time with a zone (`2026-11-26T12:00:00Z`), or an epoch
  number: seconds, or milliseconds when it is ≥ 10^11 (no seconds value that large is a
  plausible date: it would be after the year 5000).

Both become one epoch-milliseconds `notBefore` on the envelope and the STATE item. A
time already past means "now": the task is queued as any other.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Final

from agentq.errors import InvalidInput

SQS_MAX_DELAY_S: Final = 900  # SQS DelaySeconds: 15 minutes at most
MAX_DELAY_S: Final = 366 * 24 * 3600
_MS_THRESHOLD: Final = 10**11
# 9999-12-31T23:59:59.999Z: the last instant every reader of a time can show (Python's
# datetime stops at year 9999), so a later one would be stored and then break each read.
MAX_EPOCH_MS: Final = 253_402_300_799_999


def parse_time_ms(value: object, field: str = "not_before") -> int:
    """An ISO 8601 time (with a zone) or an epoch number, as epoch milliseconds."""
    if isinstance(value, bool):
        raise InvalidInput(field, "must be an ISO 8601 time or an epoch number")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(field, "must be a non-negative, finite epoch number")
        epoch_ms = int(value) if value >= _MS_THRESHOLD else int(value * 1000)
        if epoch_ms > MAX_EPOCH_MS:
            raise InvalidInput(field, "is after the year 9999")
        return epoch_ms
    if isinstance(value, str):
        text = value.strip()
        # ASCII digits with at most one point, and at least one digit ("." is no number).
        digits = text.replace(".", "", 1)
        if digits.isascii() and digits.isdigit() and all(c in "0123456789." for c in text):
            return parse_time_ms(float(text), field)
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00", 1))
        except ValueError:
            raise InvalidInput(field, f"not an ISO 8601 time: {value!r:.60}") from None
        if parsed.tzinfo is None:
            # A naive time is ambiguous across a fleet in several zones: refuse it.
            raise InvalidInput(field, "an ISO 8601 time needs a zone (Z or +hh:mm)")
        return int(parsed.timestamp() * 1000)
    raise InvalidInput(field, "must be an ISO 8601 time or an epoch number")


def resolve_not_before(
    *, delay_s: object = None, not_before: object = None, now_ms: int
) -> int | None:
    """The task's `notBefore` (epoch ms), or None when it may run at once."""
    if delay_s is not None and not_before is not None:
        raise InvalidInput("delay", "give either delay or not_before, not both")
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float):
            raise InvalidInput("delay", "must be a number of seconds")
        if not math.isfinite(delay_s) or not 0 <= delay_s <= MAX_DELAY_S:
            raise InvalidInput("delay", f"must be between 0 and {MAX_DELAY_S} seconds")
        due = now_ms + int(delay_s * 1000)
    elif not_before is not None:
        due = check_within_a_year(parse_time_ms(not_before), now_ms)
    else:
        return None
    return due if due > now_ms else None


def check_within_a_year(due_ms: int, now_ms: int, field: str = "not_before") -> int:
    """`due_ms`, or `InvalidInput` when it is more than MAX_DELAY_S ahead: the longest
    delay agentq promises to keep (docs/architecture.md, "Scheduling promises")."""
    if due_ms > now_ms + MAX_DELAY_S * 1000:
        raise InvalidInput(field, "is more than a year ahead")
    return due_ms


def remaining_s(not_before_ms: int | None, now_ms: int) -> float:
    """Seconds until a task is due (0 when due or undelayed)."""
    if not_before_ms is None:
        return 0.0
    return max(0.0, (not_before_ms - now_ms) / 1000)
