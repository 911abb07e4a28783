"""A frozen task child whose lease lapsed ends itself as it wakes (its watchdog SIGKILLs
its group at once), too soon for the task to record its end. The killer records when it
saw each thawed child gone, and the verdict bounds that execution by it; a child never
seen gone stays unbounded, so a watchdog that failed to act still shows as an overlap."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import wait_for

from agentq.local.workers import WorkerProcess
from bench.chaos_executions import executions_of, frozen_windows, overlap_s
from bench.chaos_killer import Killer, Strikes, seen_gone
from bench.chaos_model import Freeze, Kill

# The run that found the gap, its times shifted: attempt 2 (pid 11) started at 11.07 and
# was frozen with its worker from 12.0 to 24.91; attempt 3 (pid 12) took the lapsed lease
# at 19.12 and ran until 32.38. Attempt 2's child wrote no end line.
SIDE_LOG = [
    {"requestId": "r", "attempt": 2, "pid": 11, "event": "start", "t": 11.07},
    {"requestId": "r", "attempt": 3, "pid": 12, "event": "start", "t": 19.12},
    {"requestId": "r", "attempt": 3, "pid": 12, "event": "end", "t": 32.38, "outcome": "ok"},
]


def _freeze(ended: tuple[tuple[int, float], ...]) -> Freeze:
    return Freeze(at=12.0, until=24.91, worker="w1", worker_id="w1.5", pids=(11,), ended=ended)


def test_a_thawed_child_seen_gone_ends_its_execution_there() -> None:
    freeze = _freeze(ended=((11, 24.93),))
    runs = executions_of(SIDE_LOG, [], {}, [freeze])
    before, after = runs["r"]
    assert (before.pid, before.end, before.outcome) == (11, 24.93, "killed")
    # Stopped from before attempt 3 began until the thaw: it ran alongside for 20 ms.
    assert overlap_s(before, after, frozen_windows([freeze]), horizon=40.0) == pytest.approx(0.02)


def test_a_thawed_child_never_seen_gone_still_counts_as_running() -> None:
    freeze = _freeze(ended=())
    before, after = executions_of(SIDE_LOG, [], {}, [freeze])["r"]
    assert before.end is None
    # What the verdict reported for that run: attempt 3's end less the frozen span.
    overlap = overlap_s(before, after, frozen_windows([freeze]), horizon=40.0)
    assert overlap == pytest.approx(32.38 - 24.91)


@given(
    st.lists(st.floats(min_value=0, max_value=100), max_size=3),
    st.lists(st.floats(min_value=0, max_value=100), max_size=3),
    st.lists(st.floats(min_value=0, max_value=100), max_size=3),
)
def test_an_execution_without_an_end_line_ends_at_the_earliest_record(
    kill_times: list[float], fence_times: list[float], thaw_times: list[float]
) -> None:
    side_log = [{"requestId": "r", "attempt": 1, "pid": 7, "event": "start", "t": 0.0}]
    kills = [Kill(at=t, worker="w0", worker_id="w0.1", pids=(7, 8), child_only=False)
             for t in kill_times]  # fmt: skip
    fenced = {7: min(fence_times)} if fence_times else {}
    freezes = [Freeze(at=0.0, until=t, worker="w0", worker_id="w0.1", pids=(7,),
                      ended=((7, t),)) for t in thaw_times]  # fmt: skip
    (execution,) = executions_of(side_log, kills, fenced, freezes)["r"]
    records = [*kill_times, *fence_times, *thaw_times]
    assert execution.end == (min(records) if records else None)


@pytest.fixture
def stopped_sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_seen_gone_reports_the_ended_and_the_zombies_not_the_living(
    stopped_sleepers: list[subprocess.Popen[bytes]],
) -> None:
    ending, living = stopped_sleepers
    watched = [psutil.Process(ending.pid), psutil.Process(living.pid)]
    before = time.time()
    os.kill(ending.pid, signal.SIGKILL)  # not reaped: a zombie of this process
    ended = seen_gone(watched, within_s=0.5)
    assert [pid for pid, _ in ended] == [ending.pid]
    assert ended[0][1] >= before
    assert living.poll() is None


# A task child's stand-in: a group leader that, once woken, ends at once, as a child whose
# lease lapsed while it was stopped does.
WAKES_AND_ENDS = "import os, signal, time\nsignal.signal(signal.SIGCONT, lambda *_: os._exit(0))\n" \
    "print('ready', flush=True)\ntime.sleep(60)\n"  # fmt: skip


@dataclass
class Rig:
    """A killer whose one worker ("w0") is a stand-in process; every process started
    through `start` is killed at the end."""

    killer: Killer
    worker: WorkerProcess
    started: list[subprocess.Popen[bytes]]

    def start(self, *command: str, **options: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(command), start_new_session=True, **options)
        self.started.append(proc)
        return proc


@pytest.fixture
def rig() -> Iterator[Rig]:
    stand_in = subprocess.Popen(["sleep", "60"], start_new_session=True)
    worker = cast(WorkerProcess, SimpleNamespace(name="w0", pid=stand_in.pid))
    killer = Killer([worker], {}, Strikes(freeze_s=600.0), random.Random(1))
    killer._ids["w0"] = "w0.1"
    setup = Rig(killer=killer, worker=worker, started=[stand_in])
    yield setup
    for timer in killer._resumers:
        timer.cancel()
    for proc in setup.started:
        proc.kill()
        proc.wait(timeout=10)


def test_the_killer_records_when_each_thawed_child_ended(rig: Rig) -> None:
    child = rig.start(sys.executable, "-c", WAKES_AND_ENDS, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    rig.killer._freeze(rig.worker, [child.pid])
    # A stop signal is delivered asynchronously: the kernel may show the child running
    # for a moment after kill() returns.
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED,
             timeout=30, message="the child stopped")  # fmt: skip
    rig.killer._resume("w0")
    (freeze,) = rig.killer.freezes
    assert [pid for pid, _ in freeze.ended] == [child.pid]
    assert freeze.at <= freeze.until <= freeze.ended[0][1]
    assert child.wait(timeout=10) == 0
    assert psutil.Process(rig.worker.pid).status() != psutil.STATUS_STOPPED


def test_a_second_freeze_of_the_same_spares_leaves_the_first_record_alone(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker frozen twice with the same idle spares: each resume dates its own freeze
    (the first's span, stretched to the second's thaw, would hide any overlap between)."""
    monkeypatch.setattr("bench.chaos_killer.THAW_WATCH_S", 0.2)  # the spare lives on
    spare = rig.start("sleep", "60")
    for _ in range(2):
        rig.killer._freeze(rig.worker, [spare.pid])
        rig.killer._resume("w0")
    first, second = rig.killer.freezes
    assert first.ended == () and second.ended == ()
    assert first.at <= first.until <= second.at <= second.until
