"""JSON-able summaries of tasks and jobs: one shape for the CLI's `--json` and the API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.continuation import ContinueRefused, source_checkpoint
from agentq.events import iso_ms, now_ms
from agentq.jobs.store import JobRecord
from agentq.resume import override_of
from agentq.schedule import MAX_EPOCH_MS
from agentq.states import TaskState
from agentq.store import TaskRecord

__all__ = ["cost_of", "duration_ms", "ended_run_ms", "job_dict", "task_dict"]


def task_dict(record: TaskRecord) -> dict[str, Any]:
    raw = record.raw
    started, finished = raw.get("startedAt"), raw.get("finishedAt")
    return {
        "requestId": record.request_id,
        "tenant": record.tenant,
        "state": record.state.value,
        "definition": record.definition,
        "jobId": record.job_id,
        "taskKey": raw.get("taskKey") or (record.envelope or {}).get("taskKey"),
        # The finished task whose session this one continues (`submit --continue`).
        "continues": (record.envelope or {}).get("continues"),
        # Its own resume on retry (`submit --resume/--no-resume`); None: its definition's.
        "resume": override_of(record.envelope),
        # Whether `submit --continue` may start from it (what submit checks of a source).
        "continuable": _continuable(record),
        "attempt": record.attempt,
        "owner": record.owner,
        "createdAt": _iso(record.created_at_ms),
        "notBefore": _iso(raw.get("notBefore")),
        "cancelRequested": bool(raw.get("cancelRequested")) or None,
        "startedAt": _iso(started),
        "finishedAt": _iso(finished),
        "durationMs": duration_ms(record),
        "costUsd": cost_of(record),
        "error": raw.get("error"),
        "cancelReason": raw.get("cancelReason"),
        "result": raw.get("result"),
        # The folder of the attempt that settled the task (its logs, traces, artifacts).
        "artifacts": raw.get("artifacts"),
    }


def _continuable(record: TaskRecord) -> bool:
    try:
        source_checkpoint(record, record.request_id)
    except ContinueRefused:
        return False
    return True


def duration_ms(record: TaskRecord) -> int | None:
    """A task's run time, the one every view shows: its last ended attempt's child run
    as the worker measured it (`durationMs`, the same number as its end event's
    `duration_ms`, the console's attempt row and `agentq stats`); for an attempt still
    running, the time since its lock. A trace's time is the model's, not this."""
    ended = ended_run_ms(record)
    if ended is not None:
        return ended
    started = record.raw.get("startedAt")
    if record.state is not TaskState.PROCESSING or not isinstance(started, int):
        return None
    return max(0, now_ms() - started)


def ended_run_ms(record: TaskRecord) -> int | None:
    """`duration_ms` of a task whose attempt is not running (None while one runs: a
    page that refreshes counts that from `startedAt` itself, so its rows stay the same
    between changes)."""
    stored = record.raw.get("durationMs")
    if record.state is TaskState.PROCESSING or not isinstance(stored, int | float):
        return None
    return int(stored)


def cost_of(record: TaskRecord) -> float:
    for name in ("costUsd", "cost_usd"):
        value = record.raw.get(name)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def job_dict(
    job: JobRecord, tasks: Mapping[str, TaskRecord | None] | None = None
) -> dict[str, Any]:
    data = job.to_dict()
    if tasks is not None:
        data["tasks"] = [
            {"key": key, **(task_dict(r) if r else {"state": None})} for key, r in tasks.items()
        ]
    return data


def _iso(value: object) -> str | None:
    # A time no datetime can show (stored before agentq refused one) reads as unknown.
    return iso_ms(value) if isinstance(value, int) and 0 <= value <= MAX_EPOCH_MS else None
