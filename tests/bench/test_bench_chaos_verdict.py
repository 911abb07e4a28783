"""The chaos verdict's overlap measure (time two attempts of one task both ran), and the
killer's strike quotas."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from agentq.store.records import TaskRecord
from bench.chaos_executions import (
    Execution,
    executions_of,
    frozen_windows,
    overlap_s,
    ran_past_lease,
)
from bench.chaos_killer import Killer, Strikes
from bench.chaos_model import ChaosReport, Freeze, Kill
from bench.chaos_verify import _check_leases, _struck_while_held

times = st.floats(min_value=0, max_value=100, allow_nan=False)


def _run(pid: int, start: float, length: float, attempt: int) -> Execution:
    return Execution(request_id="r", attempt=attempt, pid=pid, start=start, end=start + length)


@given(times, times, times, times)
def test_overlap_is_the_shared_span_of_two_runs(a: float, la: float, b: float, lb: float) -> None:
    before, after = sorted([_run(1, a, la, 1), _run(2, b, lb, 2)], key=lambda e: e.start)
    overlap = overlap_s(before, after, {}, horizon=1_000)
    assert before.end is not None and after.end is not None
    shared = max(0.0, min(before.end, after.end) - after.start)
    assert abs(overlap - shared) < 1e-9
    assert 0 <= overlap <= min(before.end - before.start, after.end - after.start) + 1e-9


@given(times, times, times, times, st.floats(min_value=0, max_value=1))
def test_time_spent_frozen_is_not_execution(
    a: float, la: float, b: float, lb: float, share: float
) -> None:
    before, after = sorted([_run(1, a, la, 1), _run(2, b, lb, 2)], key=lambda e: e.start)
    assert before.end is not None
    # Frozen over part of the first run: never more overlap than without the freeze.
    since = before.start + share * (before.end - before.start)
    freeze = Freeze(at=since, until=before.end, worker="w0", worker_id="w0.1", pids=(before.pid,))
    frozen = frozen_windows([freeze])
    plain = overlap_s(before, after, {}, horizon=1_000)
    assert 0 <= overlap_s(before, after, frozen, horizon=1_000) <= plain + 1e-9
    # Frozen all the while the second ran: no overlap at all.
    whole = Freeze(
        at=before.start, until=before.end, worker="w0", worker_id="w0.1", pids=(before.pid,)
    )
    assert overlap_s(before, after, frozen_windows([whole]), horizon=1_000) < 1e-9


def test_an_unfinished_run_is_bounded_by_the_horizon() -> None:
    before = Execution(request_id="r", attempt=1, pid=1, start=0.0)
    after = _run(2, 5.0, 10.0, 2)
    assert overlap_s(before, after, {}, horizon=8.0) == 3.0


def _killer(kills: int, freezes: int) -> Killer:
    strikes = Strikes(freeze_share=0.25, freeze_s=10.0, min_worker_kills=20, min_freezes=10)
    killer = Killer([], {}, strikes, random.Random(1))
    killer.kills = [Kill(at=float(n), worker="w0", worker_id="w0.1", pids=(), child_only=False)
                    for n in range(kills)]  # fmt: skip
    killer.freezes = [Freeze(at=float(n), until=n + 10.0, worker="w1", worker_id="w1.1", pids=())
                      for n in range(freezes)]  # fmt: skip
    return killer


def test_the_killer_strikes_until_both_quotas_are_met() -> None:
    assert not _killer(19, 10).quota_met()
    assert not _killer(25, 9).quota_met()
    assert _killer(20, 10).quota_met()
    # Child kills do not count towards worker kills.
    killer = _killer(20, 10)
    killer.kills[0] = Kill(at=0.0, worker="w0", worker_id="w0.1", pids=(1,), child_only=True)
    assert not killer.quota_met()


def test_freezes_are_preferred_while_behind_their_share_of_the_quotas() -> None:
    # 10 of 30 quota strikes are freezes: a third.
    assert _killer(4, 1)._freezes_behind()
    assert not _killer(4, 2)._freezes_behind()
    assert not _killer(0, 10)._freezes_behind()  # its quota met: never preferred again


def test_worker_kills_are_preferred_while_behind_their_share_of_the_quotas() -> None:
    # 20 of 30 quota strikes are worker kills: two thirds.
    assert _killer(1, 2)._kills_behind()
    assert not _killer(2, 1)._kills_behind()
    assert not _killer(0, 0)._kills_behind()  # nothing struck yet: neither is behind
    assert not _killer(20, 25)._kills_behind()  # its quota met: never preferred again
    # The two preferences never pull at once.
    for kills in range(0, 21):
        for freezes in range(0, 11):
            killer = _killer(kills, freezes)
            assert not (killer._kills_behind() and killer._freezes_behind())


class _LogOnly(WorkerProcess):
    """A worker whose log the test writes: the killer reads nothing else to judge it up."""

    def start(
        self, env: Mapping[str, str], *, inherit: bool = True, fresh: bool = False
    ) -> WorkerProcess:
        return self


def _log(worker: WorkerProcess, message: str) -> None:
    with worker.log_path.open("a") as log:
        log.write(json.dumps({"level": "INFO", "message": message}) + "\n")


def test_a_worker_is_struck_only_once_up_for_the_shortest_interval(tmp_path: Path) -> None:
    """A starting worker is never struck: on a starved host, one struck before it could
    take a message was struck again and again while the run stalled."""
    worker = _LogOnly("w0", tmp_path)
    killer = Killer([worker], {}, Strikes(interval_s=(1.5, 3.0)), random.Random(1))
    _log(worker, "worker started")  # an earlier incarnation's
    _log(worker, "message received")
    killer.start_worker(worker)
    assert not killer._ready(worker, 100.0)
    _log(worker, "message received")
    assert not killer._ready(worker, 101.0)
    _log(worker, "worker started")
    assert not killer._ready(worker, 102.0)  # first seen up now
    assert not killer._ready(worker, 103.4)
    assert killer._ready(worker, 103.5)
    killer.start_worker(worker)  # struck and started again: up anew
    assert not killer._ready(worker, 200.0)


def _held(owner: str, started_s: float) -> TaskRecord:
    return TaskRecord(
        request_id="r-once", tenant="t", state=TaskState.FAILED, attempt=1, definition=None,
        job_id=None, owner=owner, lease_token="tok", effective_until_ms=None,
        created_at_ms=None, updated_at_ms=None,
        raw={"owner": owner, "startedAt": int(started_s * 1000)},
    )  # fmt: skip


def _drained(at: float, names: frozenset[str] | None) -> Freeze:
    return Freeze(at=at, until=at, worker="w0", worker_id="w0.1", pids=(), request_ids=names)


def test_a_drain_excuses_an_unrun_attempt_only_for_the_tasks_its_log_names() -> None:
    """A one-attempt task spent unrun by a live holder (its own lock read as another's)
    must not be excused by a drain of that worker that handed back other tasks."""
    record = _held("w0.1", started_s=100.0)
    other = _drained(101.0, frozenset({"r-other"}))
    named = _drained(101.0, frozenset({"r-once"}))
    assert not _struck_while_held(record, [], [other], lease_s=6.0)
    assert _struck_while_held(record, [], [named], lease_s=6.0)
    # A freeze (request_ids None) strikes whatever its worker held, within the lease.
    assert _struck_while_held(record, [], [_drained(104.0, None)], lease_s=6.0)
    assert not _struck_while_held(record, [], [_drained(120.0, None)], lease_s=6.0)


def _frozen(at: float, until: float, pids: tuple[int, ...], **extra: Any) -> Freeze:
    return Freeze(at=at, until=until, worker="w0", worker_id="w0.1", pids=pids, **extra)


def _started(pid: int, t: float, attempt: int = 1) -> dict[str, Any]:
    return {"requestId": "r", "attempt": attempt, "pid": pid, "event": "start", "t": t}


def _ended(pid: int, t: float, outcome: str, attempt: int = 1) -> dict[str, Any]:
    return {"requestId": "r", "attempt": attempt, "pid": pid, "event": "end", "t": t,
            "outcome": outcome}  # fmt: skip


def test_an_attempt_that_ran_on_after_a_freeze_past_its_lease_is_a_violation() -> None:
    # pid 7 frozen at 10 for 9 s (lease 6 s) and its code recorded its end after the thaw:
    # the stale attempt ran past its lease.
    freeze = _frozen(10.0, 19.0, (7, 8))
    side_log = [_started(7, 5.0), _ended(7, 19.01, "ok"), _started(9, 17.0, attempt=2)]
    runs = executions_of(side_log, [], {}, [freeze])
    report = ChaosReport()
    _check_leases("r", runs["r"], [freeze], 6.0, report)
    assert report.ran_past_lease == 1
    assert report.violations and "ran on past its lease" in report.violations[0]
    # Its SIGTERM handler running after the thaw is its code running too.
    side_log[1] = _ended(7, 19.2, "terminated")
    assert ran_past_lease(executions_of(side_log, [], {}, [freeze])["r"], [freeze], 6.0)


def test_an_attempt_whose_lapsed_lease_was_renewed_after_the_thaw_may_run_on() -> None:
    # No newer attempt started before its end: its worker renewed the lapsed lease first
    # (conditional on its token), so no one else held the task. A finding, no violation;
    # a newer attempt that started only after its end does not change that.
    freeze = _frozen(10.0, 19.0, (7, 8))
    side_log = [_started(7, 5.0), _ended(7, 19.5, "error"), _started(9, 21.0, attempt=2)]
    runs = executions_of(side_log, [], {}, [freeze])
    report = ChaosReport()
    _check_leases("r", runs["r"], [freeze], 6.0, report)
    assert (report.ran_past_lease, report.violations) == (0, [])
    assert report.findings and "renewed after the thaw" in report.findings[0]


def test_an_attempt_ended_while_frozen_or_at_the_thaw_is_no_violation() -> None:
    # Seen gone at the thaw (the child's lease timer SIGKILLed its group): no end line.
    gone = _frozen(10.0, 19.0, (7,), ended=((7, 19.0),))
    runs = executions_of([_started(7, 5.0)], [], {}, [gone])
    assert ran_past_lease(runs["r"], [gone], 6.0) == []
    # Ended before the freeze; started after it; a freeze shorter than the lease; a
    # freeze of another process.
    cases = [
        ([_started(7, 5.0), _ended(7, 9.9, "ok")], _frozen(10.0, 19.0, (7,))),
        ([_started(7, 19.5), _ended(7, 21.0, "ok")], _frozen(10.0, 19.0, (7,))),
        ([_started(7, 5.0), _ended(7, 14.0, "ok")], _frozen(10.0, 13.0, (7,))),
        ([_started(7, 5.0), _ended(7, 20.0, "ok")], _frozen(10.0, 19.0, (8,))),
    ]
    for side_log, freeze in cases:
        runs = executions_of(side_log, [], {}, [freeze])
        report = ChaosReport()
        _check_leases("r", runs["r"], [freeze], 6.0, report)
        assert (report.ran_past_lease, report.violations) == (0, []), (side_log, freeze)
