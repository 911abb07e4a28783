"""Whether the parts of a running local stack are alive, stalled or dead.

A part is dead when its process has exited, or when it has not answered for longer
than the stall limit. A part that misses a probe but answers again within the limit
(a loaded laptop, a suspended VM, a long scan inside moto) is only stalled: the stack
and moto's in-memory data outlive it. The clock and the probes are passed in, so the
policy is tested without waiting.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

# How long one probe waits for an answer; a miss is a stall, not yet a death.
PROBE_TIMEOUT_S: Final = 2.0
# How long a part may go unanswered before the stack gives up on it ("tens of seconds":
# longer than a loaded machine's pauses, short enough that a hung server is noticed).
DEFAULT_STALL_LIMIT_S: Final = 60.0


def answers(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """The server at `url` answered an HTTP request within `timeout_s` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, with an error status
    except OSError:
        return False


@dataclass(frozen=True)
class Part:
    """One part of the stack: `exited` says whether its process is gone (None: it has
    no process of its own), `probe` whether it answers now (None: nothing to ask)."""

    name: str
    exited: Callable[[], bool] | None = None
    probe: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Stall:
    name: str
    silent_s: float  # since the last answer (or since watching began)


@dataclass
class HealthReport:
    dead: list[str] = field(default_factory=list)  # each with the reason
    stalled: list[Stall] = field(default_factory=list)  # not answering, within the limit
    recovered: list[str] = field(default_factory=list)  # stalled at the last check, not now


class StackHealth:
    """Tracks each part's last answer across checks (call `check` every few seconds)."""

    def __init__(
        self,
        parts: Sequence[Part],
        *,
        stall_limit_s: float = DEFAULT_STALL_LIMIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._parts = list(parts)
        self._limit = stall_limit_s
        self._clock = clock
        start = clock()
        self._last_answer = {part.name: start for part in self._parts}
        self._stalled: set[str] = set()

    @property
    def stall_limit_s(self) -> float:
        return self._limit

    def check(self) -> HealthReport:
        report = HealthReport()
        for part in self._parts:
            if part.exited is not None and part.exited():
                report.dead.append(f"{part.name} (its process exited)")
                continue
            if part.probe is None:
                continue
            answered = part.probe()
            now = self._clock()  # after the probe: a probe that hung counts its own wait
            if answered:
                self._last_answer[part.name] = now
                if part.name in self._stalled:
                    self._stalled.discard(part.name)
                    report.recovered.append(part.name)
                continue
            silent = now - self._last_answer[part.name]
            if silent >= self._limit:
                report.dead.append(f"{part.name} (no answer for {silent:.0f} s)")
            else:
                self._stalled.add(part.name)
                report.stalled.append(Stall(part.name, silent))
        return report
