"""The failure policy as a decision over a job's task states (agentq.jobs.policy)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentq.jobs import JobSpec, parse_spec
from agentq.jobs.policy import NOT_STARTED, counts_as_failure, doomed_tasks
from agentq.states import TaskState
from agentq.store import TaskRecord


def _record(key: str, state: TaskState, *, requested: bool = False) -> TaskRecord:
    raw: dict[str, Any] = {"cancelRequestedAt": 1} if requested else {}
    return TaskRecord(
        request_id=f"job-{key}", tenant="t", state=state, attempt=0, definition="d",
        job_id="job", owner=None, lease_token=None, effective_until_ms=None,
        created_at_ms=None, updated_at_ms=None, raw=raw,
    )  # fmt: skip


@st.composite
def _jobs(draw: st.DrawFn) -> tuple[JobSpec, dict[str, TaskRecord | None]]:
    count = draw(st.integers(min_value=1, max_value=6))
    tasks: dict[str, Any] = {}
    for index in range(count):
        earlier = [f"k{i}" for i in range(index)]
        deps = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
        tasks[f"k{index}"] = {"definition": "d", "depends_on": deps}
    policy = draw(st.sampled_from(["fail_fast", "continue"]))
    spec = parse_spec({"tasks": tasks, "failure_policy": policy})
    states: dict[str, TaskRecord | None] = {}
    for task in spec.tasks:
        state = draw(st.none() | st.sampled_from(list(TaskState)))
        requested = draw(st.booleans())
        states[task.key] = None if state is None else _record(task.key, state, requested=requested)
    return spec, states


@given(_jobs())
def test_jobs_policy_dooms_only_tasks_not_started_with_a_reason(
    job: tuple[JobSpec, dict[str, TaskRecord | None]],
) -> None:
    spec, states = job
    doomed = doomed_tasks(spec, states)
    for key, reason in doomed.items():
        record = states[key]
        assert record is not None and record.state in NOT_STARTED
        assert reason.startswith(("fail_fast: task ", "dependency "))


@given(_jobs())
def test_jobs_policy_fail_fast_dooms_everything_waiting_once_one_failed(
    job: tuple[JobSpec, dict[str, TaskRecord | None]],
) -> None:
    spec, states = job
    doomed = doomed_tasks(spec, states)
    failed = any(r is not None and counts_as_failure(r) for r in states.values())
    waiting = {k for k, r in states.items() if r is not None and r.state in NOT_STARTED}
    if spec.failure_policy == "fail_fast" and failed:
        assert set(doomed) == waiting
    ended_badly = {
        k for k, r in states.items()
        if r is not None and r.state.terminal and r.state is not TaskState.COMPLETED
    }  # fmt: skip
    # Under `continue` (or with no failure), only a BLOCKED task whose dependency ended
    # other than COMPLETED is doomed.
    if spec.failure_policy == "continue" or not failed:
        assert set(doomed) == {
            t.key for t in spec.tasks
            if (r := states[t.key]) is not None and r.state is TaskState.BLOCKED
            and ended_badly & set(t.depends_on)
        }  # fmt: skip


def test_jobs_policy_a_cancel_the_policy_made_is_not_a_failure() -> None:
    assert counts_as_failure(_record("a", TaskState.CANCELLED, requested=True))
    assert not counts_as_failure(_record("a", TaskState.CANCELLED))
    assert counts_as_failure(_record("a", TaskState.TIMEOUT))
    assert not counts_as_failure(_record("a", TaskState.COMPLETED))
