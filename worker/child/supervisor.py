"""Child supervision: start the runner in its own session, stream its output, enforce
the timeout, and make sure nothing of it survives.

A warm spare (worker/child/spares.py), when one is ready, takes the task instead of a freshly
spawned child; it already leads its own session, so everything below applies unchanged.

The whole process group gets SIGTERM, then SIGKILL after the grace period. A task may
start processes that leave the group (setsid, a CLI that daemonizes); they stay in the
session or descend from the child, so those are hunted with psutil as well.

The attempt's lease (handed over on the `StopSignal`) is mirrored into the task dir for
the child's watchdog, and a child whose lease is about to lapse unrenewed is stopped
(`lease_lost`), SIGKILLed by the lease's `kill_at` at the latest (worker/child/leasefile.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, Literal

from agentq.events import now_ms
from worker.child.isolation import ChildUser, popen_options
from worker.child.leasefile import (
    FENCE_MESSAGE,
    FENCED_MESSAGE,
    SIGNALLED_MESSAGE,
    LeaseTimes,
    write_lease,
)
from worker.child.proctree import POLL_S, ChildProcess, descendants, reap_leftovers, terminate_tree

if TYPE_CHECKING:
    from worker.child.spares import SparePool

StopReason = Literal["timeout", "lease_lost", "shutdown", "cancelled"]
logger = logging.getLogger(__name__)
MAX_LINE_BYTES: Final = 64 * 1024
LogLine = Callable[[str, str], None]  # (stream name, line)


@dataclass(frozen=True, kw_only=True)
class ChildExit:
    returncode: int
    duration_ms: int
    stopped: StopReason | None  # set when the worker ended the child, not the task itself
    survivors_killed: int = 0
    warm: bool = False  # a pre-started spare ran the task
    started: bool = True  # False: the lease was about to lapse before the child started


class StopSignal:
    """Why a running child must end early; the first reason wins.

    It also carries the attempt's lease as last renewed (`hold`, by the heartbeat):
    `run_child` mirrors it into the task dir for the child's watchdog and stops the
    child itself (`lease_lost`) once the lease is about to lapse unrenewed.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: StopReason | None = None
        self.lease: LeaseTimes | None = None

    def hold(self, times: LeaseTimes) -> None:
        """The lease now lasts until `times.effective_until_ms` (never moves back)."""
        current = self.lease
        if current is None or times.effective_until_ms > current.effective_until_ms:
            self.lease = times

    def set(self, reason: StopReason) -> None:
        if self.reason is None:
            self.reason = reason
        self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def is_set(self) -> bool:
        return self._event.is_set()


def _pump(stream: IO[bytes], name: str, log_line: LogLine) -> None:
    with contextlib.suppress(ValueError, OSError):
        # Bounded reads: a child printing one endless line cannot exhaust our memory.
        for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
            log_line(name, raw.decode("utf-8", "replace").rstrip("\n"))
    with contextlib.suppress(OSError):
        stream.close()


def run_child(
    task_dir: Path,
    *,
    env: dict[str, str],
    timeout_s: float,
    grace_s: float,
    stop: StopSignal,
    log_line: LogLine,
    on_start: Callable[[int], None] | None = None,
    spares: SparePool | None = None,
    kind: str | None = None,
    bulk: bool = False,
    user: ChildUser | None = None,
) -> ChildExit:
    """Run ``python -m worker.child TASK_DIR`` to completion, timeout or stop.

    With `spares`, a warmed spare gets the task if one is ready (one warmed for the
    task's `kind` first; a `bulk` task leaves half the pool to the tiers above); the
    timeout clock starts at the hand-off either way, never when the spare was started.
    """
    started = time.monotonic()
    fence = _Fence(task_dir, stop)
    fence.check()
    if fence.fired is not None:
        # A slot that got to the child only this late must not start an attempt that
        # would have to be killed at once (before it could even record its start).
        return ChildExit(returncode=0, duration_ms=0, stopped="lease_lost", started=False)
    process: ChildProcess | None = _warm_child(spares, task_dir, kind, bulk)
    warm = process is not None
    if process is None:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.child", str(task_dir)],
            cwd=task_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **popen_options(user),
        )
    if on_start is not None:
        on_start(process.pid)
    assert process.stdout is not None and process.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(process.stdout, "stdout", log_line), daemon=True),
        threading.Thread(target=_pump, args=(process.stderr, "stderr", log_line), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    deadline = started + timeout_s
    known: set[int] = set()
    reason: StopReason | None = None
    exited = _exit_watch(process.pid)
    try:
        sampled = 0.0
        while process.poll() is None:
            fence.check()
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if _wait(stop, exited, min(POLL_S * 4, deadline - now, fence.seconds_left())):
                reason = stop.reason
                break
            if time.monotonic() - sampled >= POLL_S * 4:
                # Remember descendants while still attached, in case they leave the group.
                known |= descendants(process.pid)
                sampled = time.monotonic()
    finally:
        if exited is not None:
            os.close(exited)
    seen_gone_at = time.time()
    killed = 0
    if reason is not None:
        killed = terminate_tree(process, grace_s=fence.grace(grace_s), known=known)
        if fence.fired is not None:
            # When the bounded grace ran out before the task could record its end, this
            # is the only record of when the execution was over (the chaos harness reads it).
            logger.warning(FENCED_MESSAGE, extra={"pid": process.pid, "at": time.time()})
    else:
        # The task ended; a background process it left behind must not outlive it.
        killed = reap_leftovers(process.pid, known)
        signalled = -(process.returncode or 0)
        if signalled > 0:
            # A signal the worker did not send: the child's lease watchdog (renewals came
            # too late) or the kernel (out of memory). Its task code may have had no
            # chance to record its end, so this is the record of when it was over.
            logger.warning(SIGNALLED_MESSAGE, extra={"pid": process.pid,
                                                     "signal": _signal_name(signalled),
                                                     "at": seen_gone_at})  # fmt: skip
    for pump in pumps:
        pump.join(timeout=5)
    returncode = process.wait()
    return ChildExit(
        returncode=returncode,
        duration_ms=int((time.monotonic() - started) * 1000),
        stopped=reason,
        survivors_killed=killed,
        warm=warm,
    )


class _Fence:
    """The lease side of supervision (worker/child/leasefile.py).

    Mirrors each renewed lease into the task dir for the child's watchdog, and stops
    the child (`lease_lost`) once renewals have stopped succeeding long enough that the
    lease is about to lapse: cut off from DynamoDB, a stuck heartbeat.
    """

    def __init__(self, task_dir: Path, stop: StopSignal) -> None:
        self._task_dir = task_dir
        self._stop = stop
        self._mirrored: LeaseTimes | None = None
        self.fired: LeaseTimes | None = None

    def check(self) -> None:
        lease = self._stop.lease
        if lease is None:
            return
        if lease is not self._mirrored:
            self._mirrored = lease
            try:
                write_lease(self._task_dir, lease)
            except OSError as exc:
                # The worker's own fence still holds; only the frozen-worker backstop is off.
                logger.warning("lease file not written: %s", exc)
        # The worker's clock, as the lease was written and is renewed by (the chaos
        # harness skews it per worker; on a host it is the wall clock).
        now = now_ms()
        left_ms = lease.effective_until_ms - now
        if now >= lease.fence_at_ms and not self._stop.is_set():
            logger.warning(FENCE_MESSAGE, extra={"taskDir": str(self._task_dir),
                                                 "effectiveUntil": lease.effective_until_ms,
                                                 "leftMs": left_ms})  # fmt: skip
            self.fired = lease
            self._stop.set("lease_lost")

    def seconds_left(self) -> float:
        lease = self._stop.lease
        if lease is None:
            return POLL_S * 4
        return max(0.0, (lease.fence_at_ms - now_ms()) / 1000)

    def grace(self, grace_s: float) -> float:
        """A fenced child is SIGKILLed by the lease's `kill_at`, whatever CLAUDE_KILL_GRACE."""
        if self.fired is None:
            return grace_s
        return min(grace_s, max(0.0, (self.fired.kill_at_ms - now_ms()) / 1000))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _exit_watch(pid: int) -> int | None:
    """A descriptor that turns readable when `pid` exits (Linux), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait(stop: StopSignal, exited: int | None, timeout_s: float) -> bool:
    """Wait until stopped (True), the child exited or `timeout_s` passed (False).

    A task's end is noticed at once (it is on every task's critical path); a stop request
    within POLL_S.
    """
    if exited is None:
        return stop.wait(timeout_s)
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0 or select.select([exited], [], [], min(POLL_S, remaining))[0]:
            return stop.is_set()
    return True


def _warm_child(
    spares: SparePool | None, task_dir: Path, kind: str | None, bulk: bool
) -> ChildProcess | None:
    if spares is None:
        return None
    spare = spares.take(kind, bulk=bulk) or spares.fresh(kind)
    if spare is None:
        return None
    if spare.hand(task_dir):
        return spare.process
    spares.discard(spare)  # it died between the check and the hand-off
    return None
