"""A liveness file that tells a hung worker from a busy one.

The heartbeat loop touches `LIVENESS_FILE` on every beat, whether or not tasks run
and whether or not AWS answered; a busy worker keeps beating while its slots work,
so only a worker whose heartbeat loop is stuck (a hung call, a dead thread, a
deadlock) lets the file age. The container health check runs

    python -m worker.liveness

which exits 1 when the file is missing or older than `max_age_s(settings)`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from agentq.config import Settings

MIN_MAX_AGE_S = 60.0


def touch(path: str | None) -> None:
    """Mark the worker alive now (no-op without a path; never raises into the loop)."""
    if not path:
        return
    # A read-only or full disk must not stop the heartbeat it reports on.
    with contextlib.suppress(OSError):
        Path(path).touch()


def max_age_s(settings: Settings) -> float:
    # Three missed beats, so one slow beat (a throttled renewal) is no reason to restart.
    return max(MIN_MAX_AGE_S, 3 * settings.extension_interval_ms / 1000)


def is_alive(path: str, max_age: float, now: float | None = None) -> bool:
    try:
        age = (time.time() if now is None else now) - os.stat(path).st_mtime
    except OSError:
        return False
    return age <= max_age


def main() -> int:
    settings = Settings.from_env()
    if not settings.liveness_file:
        sys.stderr.write("LIVENESS_FILE is not set: nothing to check\n")
        return 1
    if is_alive(settings.liveness_file, max_age_s(settings)):
        return 0
    sys.stderr.write(f"worker heartbeat older than {max_age_s(settings):.0f}s: hung\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
