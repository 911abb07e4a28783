"""When each attempt of a task ran, for the chaos verdict: executions from the tasks'
side log (bench.tasks), each one without an end line bounded by the earliest record of
its child's end, how long two of them overlapped outside the time spent frozen, and
which ran on after a freeze that outlasted their lease.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentq.local.workers import WorkerProcess
from bench.chaos_model import Freeze, Kill
from worker.child.leasefile import FENCED_MESSAGE, SIGNALLED_MESSAGE


@dataclass
class Execution:
    request_id: str
    attempt: int
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None


def executions_of(
    side_log: Sequence[Mapping[str, Any]],
    kills: Sequence[Kill],
    fenced: Mapping[int, float] | None = None,
    freezes: Sequence[Freeze] = (),
) -> dict[str, list[Execution]]:
    """Executions per task, from the side log; one without an end line is bounded by the
    earliest record of its child's end: the kill that ended it, the worker's record of a
    fenced child it ended (a lease about to lapse leaves too little grace for the task to
    record its end) or of a child it saw ended by a signal it did not send (the child's
    lease watchdog SIGKILLed it first on a starved host), or the child seen gone after
    a freeze (its watchdog ended it)."""
    ended_by: dict[int, float] = {}

    def bound(pid: int, at: float) -> None:
        ended_by[pid] = min(at, ended_by.get(pid, at))

    for kill in kills:
        for pid in kill.pids:
            bound(pid, kill.at)
    for pid, at in (fenced or {}).items():
        bound(pid, at)
    for freeze in freezes:
        for pid, at in freeze.ended:
            bound(pid, at)
    runs: dict[tuple[str, int, int], Execution] = {}
    for line in side_log:
        key = (line["requestId"], int(line["attempt"]), int(line["pid"]))
        if line["event"] == "start":
            runs[key] = Execution(key[0], key[1], key[2], float(line["t"]))
        elif key in runs:
            runs[key].end, runs[key].outcome = float(line["t"]), str(line["outcome"])
    by_task: dict[str, list[Execution]] = {}
    for execution in runs.values():
        if execution.end is None and execution.pid in ended_by:
            execution.end, execution.outcome = ended_by[execution.pid], "killed"
        by_task.setdefault(execution.request_id, []).append(execution)
    for executions in by_task.values():
        executions.sort(key=lambda e: e.start)
    return by_task


def fenced_children(fleet: Sequence[WorkerProcess]) -> dict[int, float]:
    """Child pid -> when its worker had ended it for a lease about to lapse, or had seen
    it ended by a signal of its own watchdog (or the kernel's)."""
    ended: dict[int, float] = {}
    for worker in fleet:
        for record in worker.log_records():
            if record.get("message") in (FENCED_MESSAGE, SIGNALLED_MESSAGE):
                ended[int(record["pid"])] = float(record["at"])
    return ended


def frozen_windows(freezes: Sequence[Freeze]) -> dict[int, list[tuple[float, float]]]:
    """Child pid -> the (from, to) spans it spent stopped."""
    windows: dict[int, list[tuple[float, float]]] = {}
    for freeze in freezes:
        for pid in freeze.pids:
            windows.setdefault(pid, []).append((freeze.at, freeze.until))
    return windows


def overlap_s(
    before: Execution,
    after: Execution,
    frozen: Mapping[int, Sequence[tuple[float, float]]],
    horizon: float,
) -> float:
    """How long `before` still ran once `after` had started (its frozen time excluded)."""
    end = min(before.end if before.end is not None else horizon,
              after.end if after.end is not None else horizon)  # fmt: skip
    if end <= after.start:
        return 0.0
    stopped = sum(
        max(0.0, min(end, to) - max(after.start, since)) for since, to in frozen.get(before.pid, ())
    )
    return max(0.0, end - after.start - stopped)


def ran_past_lease(
    executions: Sequence[Execution], freezes: Sequence[Freeze], lease_s: float
) -> list[tuple[Execution, Freeze]]:
    """Executions whose own code recorded their end after a freeze that outlasted a whole
    lease (so their lease ended while they were stopped): running when stopped (started
    before, no end before) and ending by their own end line after. An execution ended by
    a kill or seen gone has no end line of its own (outcome "killed") and never counts.
    The children are stopped before `at` is taken, so an end stamped after `at` was
    written after the thaw."""
    found = []
    for freeze in freezes:
        if freeze.until - freeze.at <= lease_s:
            continue
        for execution in executions:
            if (
                execution.pid in freeze.pids
                and execution.start < freeze.at
                and execution.end is not None
                and execution.end > freeze.at
                and execution.outcome != "killed"
            ):
                found.append((execution, freeze))
    return found
