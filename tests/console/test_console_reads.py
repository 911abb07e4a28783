"""How the console reads a job's end and a task's attempts from records and events."""

from __future__ import annotations

from typing import Any

from agentq.console.reads import attempts_of, why_it_ended
from agentq.jobs import JobRecord, parse_spec


def _event(kind: str, attempt: int, at: int, **extra: Any) -> dict[str, Any]:
    return {"detailType": kind, "attempt": attempt, "timestampMs": at, **extra}


def test_attempts_come_from_the_timeline_with_worker_duration_exit_and_fence() -> None:
    events = [
        _event("Task Pending", 0, 100),
        _event("Task Processing Started", 1, 1_000, workerId="w-1", effectiveUntil=46_000),
        _event("Task Heartbeat", 1, 20_000, workerId="w-1"),
        _event("Task Processing Failed", 1, 30_000, workerId="w-1",
               payload={"error": {"category": "server", "exception_type": "LeaseFenced"}}),
        _event("Task Processing Started", 2, 32_000, workerId="w-2"),
        _event("Task Completed", 2, 33_500, workerId="w-2", payload={"cost_usd": 0.01}),
    ]  # fmt: skip
    first, second = attempts_of(events)
    assert first == {"attempt": 1, "worker": "w-1", "startedMs": 1_000, "leaseUntil": 46_000,
                     "endedMs": 30_000, "exit": "Task Processing Failed", "category": "server",
                     "fenced": True, "durationMs": 29_000}  # fmt: skip
    assert second["worker"] == "w-2" and second["exit"] == "Task Completed"
    assert second["durationMs"] == 1_500 and "fenced" not in second


def test_an_attempt_still_running_has_no_end() -> None:
    [only] = attempts_of([_event("Task Processing Started", 1, 5, workerId="w")])
    assert only == {"attempt": 1, "worker": "w", "startedMs": 5, "leaseUntil": None}


def _job(state: str, **counts: int) -> JobRecord:
    spec = parse_spec({"failure_policy": "fail_fast", "tasks": {
        "a": {"definition": "d"}, "b": {"definition": "d", "depends_on": ["a"]}}})  # fmt: skip
    return JobRecord(job_id="j", tenant="t", state=state, spec=spec, total=2,  # type: ignore[arg-type]
                     counts=counts, counted=frozenset(), cost_usd=0.0, created_at_ms=1,
                     closed_at_ms=None, closed_by=None, raw={})  # fmt: skip


def test_why_a_job_ended_names_its_failures_and_the_cancelled_dependents() -> None:
    rows = [{"key": "a", "state": "FAILED", "errorCategory": "validation"},
            {"key": "b", "state": "CANCELLED"}]  # fmt: skip
    assert why_it_ended(_job("FAILED", done=2), rows) == (
        "failed under policy fail_fast: a failed (validation); 1 dependent task(s) cancelled"
    )
    assert why_it_ended(_job("COMPLETED", done=2), rows) == "completed: all 2 tasks completed"
    running = [{"key": "a", "state": "COMPLETED"}, {"key": "b", "state": "PENDING"}]
    assert why_it_ended(_job("RUNNING"), running) == (
        "running: 1 of 2 tasks finished, 1 still to run"
    )
