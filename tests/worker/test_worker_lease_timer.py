"""A stale attempt never runs past its lease: the child's kernel timer (worker/child/leasetimer.py).

Real children (``python -m worker.child`` leading their own session, as the worker
starts them), frozen with real SIGSTOP past the lease the worker wrote for them and
continued with SIGCONT. The task code is a module in the task dir that says when it
started, then waits for a go file and writes a marker: the marker is the task code
running on. The test writes the go file while the child is stopped, so a child continued
would write its marker at once, as a task whose sleep lapsed during the freeze would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from support import wait_for

from agentq.definitions import TaskDefinition
from worker.child.forkclient import ForkServer
from worker.child.leasefile import LeaseTimes, Watchdog, write_lease
from worker.child.leasetimer import LEASE_SIGNAL, LeaseTimer
from worker.child.proctree import ChildProcess
from worker.child.runner import READY_LINE

pytestmark = pytest.mark.timeout(90)

# A lease the child holds long enough to start its task (a loaded host included), short
# enough that the tests stay quick.
TERM_IN_S: Final = 3.0
WINDOW_S: Final = 0.5

_TASK: Final = """
import os, subprocess, sys, time
from pathlib import Path

GRANDCHILD = (
    "import os, signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"  # like a CLI that traps it
    "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
    "time.sleep(float(sys.argv[2]))\\n"
    "open(sys.argv[3], 'w').write('ran on')\\n"
)


def run(payload, ctx):
    if payload.get("grandchild"):
        subprocess.Popen([sys.executable, "-c", GRANDCHILD, payload["grandchild"],
                          str(payload["grandchild_seconds"]), payload["grandchild_marker"]])
    Path(payload["started"]).write_text(str(os.getpid()))
    go = Path(payload["go"])
    while not go.exists():
        time.sleep(0.02)
    Path(payload["marker"]).write_text("ran on")
    return {"ran": True}
"""


def _lease(term_in_s: float) -> LeaseTimes:
    term = int((time.time() + term_in_s) * 1000)
    kill = term + int(WINDOW_S * 1000)
    return LeaseTimes(effective_until_ms=kill + 500, fence_at_ms=term - 200, term_at_ms=term,
                      kill_at_ms=kill)  # fmt: skip


def _task_dir(tmp_path: Path, **payload: Any) -> Path:
    (tmp_path / "lease_task.py").write_text(_TASK)
    definition = TaskDefinition(name="t", kind="python", settings={"callable": "lease_task:run"})
    task = {"requestId": "r-1", "tenant": "acme", "attempt": 1, "jobId": None,
            "definition": definition.to_dict(),
            "input": {"started": str(tmp_path / "started"), "marker": str(tmp_path / "marker"),
                      "go": str(tmp_path / "go"), **payload}}  # fmt: skip
    (tmp_path / "task.json").write_text(json.dumps(task))
    return tmp_path


def _state(pid: int) -> str | None:
    """The process's state letter (T stopped, Z zombie), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _past(epoch_ms: int) -> bool:
    return time.time() * 1000 > epoch_ms


@contextlib.contextmanager
def _child(task_dir: Path, start: str = "cold") -> Iterator[ChildProcess]:
    """A child running the task: started for it (cold), or a warm spare (a spawned one,
    or one the fork server forked) handed the task as the worker hands it over."""
    server: ForkServer | None = None
    child: ChildProcess
    if start == "cold":
        child = subprocess.Popen([sys.executable, "-m", "worker.child", str(task_dir)],
                                 cwd=task_dir, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)  # fmt: skip
    elif start == "spare":
        child = subprocess.Popen([sys.executable, "-m", "worker.child", "--spare"],
                                 cwd=task_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    else:
        server = ForkServer(env=dict(os.environ), cwd=task_dir, user=None)
        child = server.fork()
    try:
        if start != "cold":
            assert child.stdin is not None and child.stdout is not None
            assert child.stdout.readline() == READY_LINE
            child.stdin.write(json.dumps({"task_dir": str(task_dir)}).encode() + b"\n")
            child.stdin.flush()
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGCONT)
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if server is not None:
            server.close()


def _freeze_past(pid: int, task_dir: Path, times: LeaseTimes, *, group: bool) -> None:
    """SIGSTOP (the child alone, or its whole group) until its lease's end has passed."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    wait_for(lambda: _state(pid) == "T", timeout=10, message="the child stopped")
    (task_dir / "go").write_text("go")  # continued, its task code would finish at once
    wait_for(lambda: _past(times.kill_at_ms + 300), timeout=30, message="the lease ran out")
    (os.killpg if group else os.kill)(pid, signal.SIGCONT)


def test_lease_timer_fires_at_the_wall_clock_time_it_was_armed_for() -> None:
    timer = LeaseTimer.create()
    assert timer is not None, "POSIX timers are available on Linux"
    seen: list[float] = []
    previous = signal.signal(LEASE_SIGNAL, lambda signum, frame: seen.append(time.time()))
    try:
        at_ms = int(time.time() * 1000) + 200
        assert timer.arm_at(at_ms)
        wait_for(lambda: seen, timeout=10, message="the timer's signal")
        assert seen[0] * 1000 >= at_ms - 5  # never before its time (the clock's granularity)
        timer.arm_at(int(time.time() * 1000) + 60_000)
        timer.disarm()
        timer.arm_at(1)  # a time already past fires at once
        wait_for(lambda: len(seen) == 2, timeout=10, message="an immediate expiry")
    finally:
        timer.disarm()
        signal.signal(LEASE_SIGNAL, previous)


def _blocked_signals(thread_id: int) -> set[int]:
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    mask = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16
    )
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def test_only_the_task_thread_can_take_the_lease_timers_signal(tmp_path: Path) -> None:
    """A thawed child's lapsed lease must stop the task code itself: a signal taken by
    the watchdog thread would only flag the main thread, which runs on until it checks."""
    write_lease(tmp_path, _lease(600))
    previous = signal.getsignal(LEASE_SIGNAL)
    watchdog = Watchdog(tmp_path, on_expiry=lambda: None).start()
    try:
        thread = watchdog._thread
        wait_for(lambda: LEASE_SIGNAL in _blocked_signals(thread.native_id or 0), timeout=10,
                 message="the watchdog thread blocks the lease signal")  # fmt: skip
        assert LEASE_SIGNAL not in _blocked_signals(threading.main_thread().native_id or 0)
    finally:
        watchdog.close()
        signal.signal(LEASE_SIGNAL, previous)


@pytest.mark.parametrize("start", ["cold", "spare", "forked"])
def test_a_child_frozen_past_its_lease_is_ended_on_sigcont_before_its_task_runs_on(
    tmp_path: Path, start: str
) -> None:
    task_dir = _task_dir(tmp_path)
    times = _lease(TERM_IN_S)
    write_lease(task_dir, times)  # as the worker does before it starts (or hands over)
    with _child(task_dir, start) as child:
        wait_for((task_dir / "started").exists, timeout=30, message="the task started")
        assert not _past(times.term_at_ms), "the child took longer than its lease to start"
        _freeze_past(child.pid, task_dir, times, group=False)
        code = child.wait(timeout=30)
        stderr = child.stderr.read() if child.stderr else b""
    assert code == -signal.SIGKILL, stderr[-2000:]
    assert not (task_dir / "marker").exists(), "the stale attempt's code ran on after its lease"
    assert not (task_dir / "artifacts" / "task-result.json").exists()
    record = json.loads((task_dir / "error.json").read_text())
    assert (record["exception_type"], record["retryable"]) == ("LeaseExpired", True)


def test_a_child_whose_lease_was_renewed_while_it_was_frozen_runs_on(tmp_path: Path) -> None:
    task_dir = _task_dir(tmp_path)
    times = _lease(TERM_IN_S)
    write_lease(task_dir, times)
    with _child(task_dir) as child:
        wait_for((task_dir / "started").exists, timeout=30, message="the task started")
        assert not _past(times.term_at_ms), "the child took longer than its lease to start"
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: _state(child.pid) == "T", timeout=10, message="the child stopped")
        # Its worker renewed the lease meanwhile: the old expiry fires on SIGCONT and the
        # child finds the renewal, re-arms and goes on.
        write_lease(task_dir, _lease(60.0))
        (task_dir / "go").write_text("go")
        wait_for(lambda: _past(times.kill_at_ms + 300), timeout=30, message="the old lease's end")
        os.kill(child.pid, signal.SIGCONT)
        code = child.wait(timeout=30)
        stderr = child.stderr.read() if child.stderr else b""
    assert code == 0, stderr[-2000:]
    assert (task_dir / "marker").read_text() == "ran on"
    assert not (task_dir / "error.json").exists()


def test_a_grandchild_in_the_frozen_group_dies_with_the_stale_child(tmp_path: Path) -> None:
    grandchild_pid = tmp_path / "grandchild.pid"
    grandchild_marker = tmp_path / "grandchild-marker"
    # The grandchild ignores SIGTERM (as the Claude CLI may) and would still be working
    # when the group is continued; the child's go file appears while it is stopped.
    task_dir = _task_dir(tmp_path, grandchild=str(grandchild_pid),
                         grandchild_seconds=TERM_IN_S + 20,
                         grandchild_marker=str(grandchild_marker))  # fmt: skip
    times = _lease(TERM_IN_S)
    write_lease(task_dir, times)
    with _child(task_dir) as child:
        wait_for((task_dir / "started").exists, timeout=30, message="the task started")
        pid = int(wait_for(lambda: grandchild_pid.exists() and grandchild_pid.read_text(),
                           timeout=30, message="the grandchild started"))  # fmt: skip
        assert not _past(times.term_at_ms), "the child took longer than its lease to start"
        _freeze_past(child.pid, task_dir, times, group=True)
        code = child.wait(timeout=30)
        wait_for(lambda: not _alive(pid), timeout=10, message="the grandchild ended")
    assert code == -signal.SIGKILL
    assert not (task_dir / "marker").exists()
    assert not grandchild_marker.exists()
