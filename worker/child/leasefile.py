"""An attempt never outlives its lease: the worker fences itself, the child fences itself.

The lease (`effectiveUntil` on the STATE item, 1.5 x VISIBILITY_EXTENSION_AMOUNT ahead
of the last renewal) fences the STATE item; once it lapses another worker may start the
next attempt. So the execution must be over before then, whatever happened to the
worker that holds it:

- a worker cut off from DynamoDB is still running: `supervisor.run_child` stops the child
  (reason `lease_lost`: SIGTERM, SIGKILL after the grace) at `fence_at`;
- a frozen worker (SIGSTOP, GC pause, CPU starvation) runs nothing: the child's
  watchdog ends its own process group at `term_at` (SIGTERM, so task code and the
  Claude CLI record their end) and SIGKILLs what is left at `kill_at`;
- a frozen child runs nothing either, but its lease's end is a kernel timer
  (worker/child/leasetimer.py) that keeps counting: continued after `kill_at`, the child
  SIGKILLs its whole group before its task code runs another instruction.

`lease_times` places the three moments before `effectiveUntil`; the worker mirrors them
into `TASK_DIR/lease.json` (temp file + rename) at every renewal. Worker and child read
one host's wall clock. No lease file (an older worker, a child run by hand): no watchdog.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from worker.child.leasetimer import LEASE_SIGNAL, LeaseTimer

if TYPE_CHECKING:  # the task child runs the watchdog and must not import the model
    from agentq.config import Settings

LEASE_FILE: Final = "lease.json"
CHECK_S: Final = 0.1
# Signal delivery, process exit and polling, all inside the lease, even on a loaded host.
SETTLE_S: Final = 1.0
# How far two hosts' clocks may disagree without two attempts overlapping: a taker whose
# clock runs ahead sees the lease lapse early by that much, so the holder's SIGKILL lands
# this much earlier still. Capped at L/12 for short leases (docs/architecture.md).
CLOCK_SKEW_BUDGET_S: Final = 2.0
# What each fence logs (the chaos harness counts them).
FENCE_MESSAGE: Final = "lease not renewed in time; stopping the task"
FENCED_MESSAGE: Final = "fenced child ended"
SIGNALLED_MESSAGE: Final = "child ended by a signal the worker did not send"
WATCHDOG_LINE: Final = "agentq: lease not renewed in time; ending this attempt"


@dataclass(frozen=True, kw_only=True)
class LeaseTimes:
    """When an attempt must be stopped (epoch ms, this host's clock)."""

    effective_until_ms: int  # another worker may take the task over from here on
    fence_at_ms: int  # a live worker stops the child: SIGTERM, SIGKILL after the grace
    term_at_ms: int  # the child's watchdog SIGTERMs its process group
    kill_at_ms: int  # ... and SIGKILLs whatever is left of it

    def to_json(self) -> str:
        return json.dumps(
            {"effectiveUntil": self.effective_until_ms, "fenceAt": self.fence_at_ms,
             "termAt": self.term_at_ms, "killAt": self.kill_at_ms}
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> LeaseTimes | None:
        try:
            data = json.loads(text)
            values = [data[k] for k in ("effectiveUntil", "fenceAt", "termAt", "killAt")]
        except (ValueError, KeyError, TypeError):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return None
        until, fence, term, kill = values
        return cls(effective_until_ms=until, fence_at_ms=fence, term_at_ms=term, kill_at_ms=kill)


@dataclass(frozen=True, kw_only=True)
class Margins:
    """Seconds before `effectiveUntil` (see `margins`)."""

    fence_s: float
    term_s: float
    kill_s: float


def margins(settings: Settings) -> Margins:
    """Where the fences sit, from the lease L, heartbeat interval I and kill grace G.

    The margins cover *stopping* an attempt, not renewing it: the child gets
    g = min(G, L/6) between SIGTERM and SIGKILL, and the kill lands s + k before the
    lease lapses: s = min(1 s, L/6) to deliver it, k = `skew_budget` (2 s by default)
    for a taker whose clock runs ahead. The child's watchdog fires at g + s + k. A live
    worker fences one more grace earlier (2g + s + k), so its own stop (same g) is over
    before the watchdog would fire and the worker knows why the child ended
    (`lease_lost`). A normal renewal comes every I, so the lease never has less than
    L - I left; the worker's fence stays below half of that, or one late heartbeat would
    stop a task. With the defaults (L 45 s, I 20 s, G 5 s): fence 12.5 s, SIGTERM 8 s,
    SIGKILL 3 s before the lease lapses (skew budget 2 s); with the tests' (L 3 s,
    I 0.3 s, G 0.5 s): 1.35, 1.25, 0.75 s (skew budget 0.25 s).
    """
    lease = settings.lease_seconds
    grace = min(settings.kill_grace_ms / 1000, lease / 6)
    kill = min(SETTLE_S, lease / 6) + skew_budget(settings)
    term = grace + kill
    normal_low = lease - settings.extension_interval_ms / 1000
    fence = min(2 * grace + kill, max(term, normal_low / 2))
    return Margins(fence_s=fence, term_s=term, kill_s=kill)


def skew_budget(settings: Settings) -> float:
    """Seconds two hosts' clocks may differ by while executions still never overlap.

    CLOCK_SKEW_BUDGET_S, less for short leases (L/12) and for a heartbeat interval so
    close to the lease that the watchdog would otherwise fire between two renewals.
    """
    lease = settings.lease_seconds
    grace = min(settings.kill_grace_ms / 1000, lease / 6)
    spare = lease - settings.extension_interval_ms / 1000 - grace - min(SETTLE_S, lease / 6)
    return max(0.0, min(CLOCK_SKEW_BUDGET_S, lease / 12, spare / 2))


def lease_times(effective_until_ms: int, settings: Settings) -> LeaseTimes:
    m = margins(settings)
    return LeaseTimes(
        effective_until_ms=effective_until_ms,
        fence_at_ms=effective_until_ms - int(m.fence_s * 1000),
        term_at_ms=effective_until_ms - int(m.term_s * 1000),
        kill_at_ms=effective_until_ms - int(m.kill_s * 1000),
    )


def write_lease(task_dir: Path, times: LeaseTimes) -> None:
    """Atomically: the child never reads half a file."""
    path = task_dir / LEASE_FILE
    partial = path.with_name(LEASE_FILE + ".partial")
    partial.write_text(times.to_json())
    os.replace(partial, path)


def read_lease(task_dir: Path) -> LeaseTimes | None:
    try:
        return LeaseTimes.from_json((task_dir / LEASE_FILE).read_text())
    except OSError:
        return None


# -- the child's side ------------------------------------------------------------------------
def _now_ms() -> int:
    return int(time.time() * 1000)


def _group_members(pgid: int) -> Iterator[int]:
    """Live (not zombie) processes of a process group, from /proc (no psutil in children)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            yield int(name)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_until(deadline_ms: int, done: Callable[[], bool]) -> None:
    while _now_ms() < deadline_ms and not done():
        time.sleep(min(CHECK_S / 2, max(0.0, (deadline_ms - _now_ms()) / 1000)))


def end_group(times: LeaseTimes) -> None:
    """SIGTERM the group, SIGKILL it at `kill_at`; this process is ended last.

    This process may die of its SIGTERM at once (no handler), and nothing would then
    SIGKILL the rest of the group. So the others go first: SIGTERM, and SIGKILL for
    those still there halfway to `kill_at`; then the group again, this process with it
    (in-process task code gets its SIGTERM, e.g. to record its end); at `kill_at`,
    SIGKILL for whatever is left, this process included.
    """
    me, pgid = os.getpid(), os.getpgrp()
    if pgid != me:
        # Not the leader of its own group (the worker always makes it one): end only itself.
        _signal(me, signal.SIGTERM)
        _wait_until(times.kill_at_ms, lambda: False)
        _signal(me, signal.SIGKILL)
        return

    def others() -> list[int]:
        return [pid for pid in _group_members(pgid) if pid != me]

    for pid in others():
        _signal(pid, signal.SIGTERM)
    halfway = (times.term_at_ms + times.kill_at_ms) // 2
    _wait_until(halfway, lambda: not others())
    for pid in others():
        _signal(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    _wait_until(times.kill_at_ms, lambda: False)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Watchdog:
    """The child's lease watchdog: a kernel timer at `term_at`, and a thread that re-arms it.

    The thread reads each renewal from the lease file and moves the timer (`LeaseTimer`)
    to the new `term_at`; it also ends the attempt itself where no timer could be made.
    The timer's signal runs `_on_timer` in the main thread before any further task
    code: a child frozen past its lease's `kill_at` ends its group at once, SIGKILL,
    when it is continued (`end_now`); one that still has time left is stopped as at
    `term_at`, by the thread (`end_group`). The times come only from the worker's
    file, whose every lease was granted by a renewal conditional on the lease token:
    nothing here extends a lease, and a stale write carries times already past.
    """

    def __init__(self, task_dir: Path, *, on_expiry: Callable[[], None]) -> None:
        self._task_dir = task_dir
        self._on_expiry = on_expiry
        self.fired = threading.Event()
        self._woken = threading.Event()
        self._closed = False
        self._times: LeaseTimes | None = None
        self._timer: LeaseTimer | None = None
        self._armed_ms: int | None = None
        self._thread = threading.Thread(target=self._watch, name="lease-watchdog", daemon=True)

    def start(self) -> Watchdog:
        # Handlers can only be installed from the main thread (where the task runs).
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(LEASE_SIGNAL, self._on_timer)
                # Armed before the task's first instruction (the worker writes the file
                # before it starts the child), a spare's at its hand-off.
                self._timer = LeaseTimer.create(LEASE_SIGNAL)
        times = self._current()
        if times is not None:
            self._arm(times)
        self._thread.start()
        return self

    def close(self) -> None:
        """The task is over (its result or error is written): no more stopping."""
        self._closed = True
        if self._timer is not None:
            with contextlib.suppress(OSError):
                self._timer.disarm()

    def _arm(self, times: LeaseTimes, *, again: bool = False) -> None:
        """Move the timer to `times.term_at_ms` (`again`: it has fired, arm it anew)."""
        timer = self._timer
        if timer is not None and (again or self._armed_ms != times.term_at_ms):
            self._armed_ms = times.term_at_ms
            timer.arm_at(times.term_at_ms)

    def _current(self) -> LeaseTimes | None:
        # The file may appear only at the first renewal, and the worker may remove the
        # task dir at the end: keep the last lease read.
        self._times = read_lease(self._task_dir) or self._times
        return self._times

    def _on_timer(self, signum: int, frame: object) -> None:
        times = self._current()
        if self._closed or times is None:
            return
        now = _now_ms()
        if now < times.term_at_ms:
            # Renewed since the timer was set (or the clock was stepped back): still held.
            self._arm(times, again=True)
            return
        if now >= times.kill_at_ms:
            self.end_now()  # thawed past the lease's end: not one more instruction
        self._woken.set()  # time is left: the thread stops the group as at term_at

    def end_now(self) -> None:
        """Record the end and SIGKILL the whole group, this process with it, at once."""
        self.fired.set()
        with contextlib.suppress(Exception):  # the record is a courtesy; the stop is not
            self._on_expiry()
        _announce()
        me, pgid = os.getpid(), os.getpgrp()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pgid == me:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(me, signal.SIGKILL)

    def _watch(self) -> None:
        # The timer's signal must interrupt the main thread (the task's): taken by this
        # thread, it would only flag the main thread, whose task code runs on until its
        # next check, and may finish a stale attempt's work first.
        with contextlib.suppress(ValueError, OSError):
            signal.pthread_sigmask(signal.SIG_BLOCK, {LEASE_SIGNAL})
        while True:
            times = self._current()
            if self._closed:
                return
            if times is not None:
                self._arm(times)
                now = _now_ms()
                if now >= times.kill_at_ms:
                    self.end_now()
                if now >= times.term_at_ms:
                    break
            wait_ms = CHECK_S * 1000 if times is None else times.term_at_ms - _now_ms()
            if self._woken.wait(max(0.0, min(CHECK_S, wait_ms / 1000))):
                self._woken.clear()  # the file, read again above, decides
        self.fired.set()
        with contextlib.suppress(Exception):
            self._on_expiry()
        _announce()
        end_group(times)


def _announce() -> None:
    """The watchdog's line on stderr, unless the pipe is full (its reader may be frozen)."""
    with contextlib.suppress(OSError, ValueError):
        if select.select([], [2], [], 0)[1]:  # writable: PIPE_BUF bytes free, no blocking
            os.write(2, WATCHDOG_LINE.encode() + b"\n")
