"""The scheduling verdict's own logic, on made-up executions (no stack): a tenant over
its limit longer than the skew budget, frozen time not counted as running, and the
cancel answers' rules."""

from __future__ import annotations

from agentq.states import TaskState
from bench.chaos_executions import Execution
from bench.chaos_model import ScheduleVerdict
from bench.chaos_sched import CancelAnswer
from bench.chaos_sched_verify import _check_cancel, running_over


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
