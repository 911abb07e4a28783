"""The scheduling verdict's own logic, on made-up executions and logs (no stack): a
tenant over its limit longer than the skew budget, frozen time not counted as running,
the cancel answers' rules, and when a task counts as parked."""

from __future__ import annotations

from datetime import UTC, datetime

from agentq.states import TaskState
from agentq.store.tasks import TaskRecord
from bench.chaos_executions import Execution
from bench.chaos_model import Freeze, Kill, ScheduleVerdict
from bench.chaos_sched import CancelAnswer
from bench.chaos_sched_verify import (
    MARK_FAILED,
    PARKED,
    UNPARKED,
    Park,
    _check_cancel,
    lost_task_problem,
    parked_at,
    parked_stretches,
    running_over,
)


def execution(
    rid: str, start: float, end: float | None, *, pid: int = 1, attempt: int = 1
) -> Execution:
    return Execution(request_id=rid, attempt=attempt, pid=pid, start=start, end=end, outcome="ok")


def test_two_running_for_one_seat_past_the_budget_is_a_stretch_over_the_limit() -> None:
    runs = [execution("a", 0.0, 10.0, pid=1), execution("b", 5.0, 9.0, pid=2)]
    most, stretches = running_over(runs, 1, {}, horizon=100.0, budget_s=2.0)
    assert most == 2 and stretches == [(5.0, 9.0, 2)]


def test_an_overlap_within_the_budget_or_while_frozen_is_not() -> None:
    brief = [execution("a", 0.0, 5.0, pid=1), execution("b", 4.0, 8.0, pid=2)]
    assert running_over(brief, 1, {}, horizon=100.0, budget_s=2.0)[1] == []
    # a's child was stopped from 3 s to 9 s: b ran alone meanwhile.
    frozen = [execution("a", 0.0, 10.0, pid=1), execution("b", 3.5, 8.5, pid=2)]
    most, stretches = running_over(frozen, 1, {1: [(3.0, 9.0)]}, horizon=100.0, budget_s=0.5)
    assert stretches == [] and most == 1


def test_one_ending_as_another_starts_is_not_two_running() -> None:
    back_to_back = [execution("a", 0.0, 4.0, pid=1), execution("b", 4.0, 8.0, pid=2)]
    assert running_over(back_to_back, 1, {}, horizon=100.0, budget_s=0.0) == (1, [])


def answer(outcome: str, attempt: int) -> CancelAnswer:
    return CancelAnswer(request_id="t", moment="racing", answered_at=0.0, outcome=outcome,
                        state="", attempt=attempt)  # fmt: skip


def test_a_cancel_answer_is_broken_by_a_newer_attempt_or_another_end() -> None:
    cases = [
        # (answer, final state, final attempt, executions' attempts, violations)
        (answer("cancelled", 0), TaskState.CANCELLED, 0, [], 0),
        (answer("requested", 1), TaskState.COMPLETED, 1, [1], 0),  # its attempt finished first
        (answer("requested", 1), TaskState.CANCELLED, 1, [1], 0),
        (answer("requested", 1), TaskState.COMPLETED, 2, [1, 2], 2),  # ran again, not kept
        (answer("requested", 1), TaskState.CANCELLED, 2, [1], 1),  # locked again, code not run
        (answer("cancelled", 0), TaskState.COMPLETED, 0, [], 1),
        (answer("finished", 1), TaskState.COMPLETED, 1, [1], 0),
    ]
    for given, state, attempt, attempts, expected in cases:
        verdict, violations = ScheduleVerdict(), list[str]()
        runs = [execution("t", float(n), float(n) + 0.5, attempt=n) for n in attempts]
        _check_cancel(given, state, attempt, runs, verdict, violations)
        assert len(violations) == expected, (given, state, attempt, violations)


def log(message: str, rid: str, second: float) -> dict[str, object]:
    stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return {"message": message, "requestId": rid, "timestamp": f"{stamp}+0000"}


def kill(worker: str, at: float) -> Kill:
    return Kill(at=at, worker=worker, worker_id=f"{worker}-1", pids=(), child_only=False)


def test_a_park_lasts_from_its_line_to_its_seat_or_its_workers_death() -> None:
    logs = {
        "w0": [log(PARKED, "a", 100.0), log(PARKED, "b", 101.0), log(UNPARKED[0], "a", 104.5),
               log(PARKED, "c", 110.0)],
        "w1": [log(PARKED, "d", 100.0)],
    }  # fmt: skip
    parks = parked_stretches(logs, [kill("w0", 103.0), kill("w1", 90.0)], horizon=200.0)

    # a: its worker died at 103 s (the seat line is another incarnation's, after it).
    assert parks["a"] == [Park("w0", 100.0, 103.0)]
    assert parks["b"] == [Park("w0", 101.0, 103.0)]
    assert parks["c"] == [Park("w0", 110.0, 200.0)]  # still parked at the end
    assert parks["d"] == [Park("w1", 100.0, 200.0)]  # its worker died before it parked
    assert parked_at(parks["a"], [], 102.0) == "w0"
    assert parked_at(parks["a"], [], 103.5) is None


def test_a_re_send_while_frozen_or_after_a_refused_mark_is_not_held_against_the_park() -> None:
    logs = {"w0": [log(PARKED, "a", 100.0), log(MARK_FAILED, "a", 101.0),
                   log(PARKED, "b", 100.0), log(UNPARKED[1], "a", 112.0),
                   log(UNPARKED[1], "b", 112.0)]}  # fmt: skip
    parks = parked_stretches(logs, [], horizon=200.0)
    freeze = Freeze(at=104.0, until=106.0, worker="w0", worker_id="w0-1", pids=())

    assert parks["a"] == [Park("w0", 100.0, 112.0, mark_failed=True)]
    assert parked_at(parks["a"], [], 110.0) is None
    assert parked_at(parks["b"], [], 110.0) == "w0"
    assert parked_at(parks["b"], [freeze], 110.0) is None


def _record(state: TaskState, attempt: int = 1) -> TaskRecord:
    return TaskRecord(request_id="lost-1", tenant="t", state=state, attempt=attempt,
                      definition="bench-work", job_id=None, owner=None, lease_token=None,
                      effective_until_ms=None, created_at_ms=None, updated_at_ms=None,
                      raw={"error": {"category": "server"}})  # fmt: skip


def test_a_lost_task_is_repaired_once_re_sent_and_taken_up_however_it_ended() -> None:
    repaired = {"detailType": "Task Repaired"}
    started = {"detailType": "Task Processing Started"}
    # Re-sent, locked by a worker, ended: the reconciler kept its promise. A FAILED end
    # (its holders struck by the killer) is the core verdict's to judge, not this one's.
    for state in (TaskState.COMPLETED, TaskState.FAILED):
        assert lost_task_problem([repaired, started], _record(state, attempt=3)) is None
    # A worker's event may carry an earlier time than the repair (a skewed clock).
    assert lost_task_problem([started, repaired], _record(TaskState.COMPLETED)) is None
    # Its lock counted on the STATE item, the started event lost with a killed worker.
    assert lost_task_problem([repaired], _record(TaskState.COMPLETED, attempt=1)) is None
    # Never re-sent; re-sent but never locked (closed some other way); not ended.
    never = lost_task_problem([], _record(TaskState.PENDING, attempt=0))
    assert never is not None and never.startswith("never re-sent")
    unlocked = lost_task_problem([repaired], _record(TaskState.FAILED, attempt=0))
    assert unlocked is not None and "never locked" in unlocked
    assert lost_task_problem([repaired, started], _record(TaskState.PROCESSING)) is not None
    assert lost_task_problem([repaired], None) is not None
