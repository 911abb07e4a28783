"""Ending a child's whole process tree: its group, its session, and what escaped both.

Shared by the supervisor (a task's child) and the spare pool (a warm spare nobody
took); kept apart so neither has to import the other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import IO, Final, Protocol

import psutil

POLL_S: Final = 0.05


def _members(session: int, known: set[int]) -> list[psutil.Process]:
    """Live processes of the child's session or group, or descendants we saw."""
    found: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            member = (
                proc.pid in known
                or os.getsid(proc.pid) == session
                or os.getpgid(proc.pid) == session
            )
            if member and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies answer signal 0; only a live member counts.
    return bool(_members(pgid, set()))


class ChildProcess(Protocol):
    """What supervising a child needs of it: a `subprocess.Popen`, or a spare the fork
    server forked (agentq.forking.ForkedProcess), whose parent is not the worker."""

    pid: int
    returncode: int | None

    @property
    def stdin(self) -> IO[bytes] | None: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    @property
    def stderr(self) -> IO[bytes] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def terminate_tree(process: ChildProcess, *, grace_s: float, known: set[int]) -> int:
    """SIGTERM the group, SIGKILL after `grace_s`, then kill anything that escaped.

    Returns how many escaped processes had to be killed individually.
    """
    pgid = process.pid  # start_new_session: the child leads its own session and group
    known |= descendants(process.pid)
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=POLL_S)
    _signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    return reap_leftovers(pgid, known)


def reap_leftovers(session: int, known: set[int]) -> int:
    """Kill whatever of the child's session, group or known descendants still lives."""
    killed = 0
    for _ in range(3):
        survivors = _members(session, known)
        if not survivors:
            break
        for proc in survivors:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed += 1
        psutil.wait_procs(survivors, timeout=2)
    return killed
