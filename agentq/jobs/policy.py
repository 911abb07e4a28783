"""A job's failure policy, decided from its tasks' states (the dispatcher acts on it).

`fail_fast` dooms every task not started once one failed or timed out; `continue`
dooms only what depends on a failure. A BLOCKED task whose dependency ended other than
COMPLETED is doomed under either policy, so a cancellation cascades.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from agentq.jobs.spec import JobSpec
from agentq.states import TaskState
from agentq.store import TaskRecord

FAILURES: Final = frozenset({TaskState.FAILED, TaskState.TIMEOUT})
NOT_STARTED: Final = frozenset({TaskState.BLOCKED, TaskState.SCHEDULED, TaskState.PENDING})


def counts_as_failure(record: TaskRecord) -> bool:
    # A task someone cancelled (agentq cancel, running or not) is a failure the policy
    # answers; one the policy itself cancelled is not, or fail_fast would feed on itself.
    if record.state is TaskState.CANCELLED:
        return "cancelRequestedAt" in record.raw
    return record.state in FAILURES


def doomed_tasks(spec: JobSpec, states: Mapping[str, TaskRecord | None]) -> dict[str, str]:
    """The tasks to cancel now, by key, each with the reason it is cancelled."""
    failed = [k for k, r in states.items() if r and counts_as_failure(r)]
    doomed: dict[str, str] = {}
    if failed and spec.failure_policy == "fail_fast":
        first = states[failed[0]]
        assert first is not None
        reason = f"fail_fast: task {failed[0]} {first.state.value.lower()}"
        for key, record in states.items():
            if record and record.state in NOT_STARTED:
                doomed[key] = reason
    for task in spec.tasks:
        record = states.get(task.key)
        if not record or record.state is not TaskState.BLOCKED or task.key in doomed:
            continue
        for dep in task.depends_on:
            dep_record = states.get(dep)
            if (
                dep_record
                and dep_record.state.terminal
                and dep_record.state is not (TaskState.COMPLETED)
            ):
                doomed[task.key] = f"dependency {dep} {dep_record.state.value.lower()}"
                break
    return doomed
