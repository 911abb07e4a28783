"""JSON-able summaries of tasks and jobs: one shape for the CLI's `--json` and the API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.events import iso_ms, now_ms
from agentq.jobs.store import JobRecord
from agentq.schedule import MAX_EPOCH_MS
from agentq.store import TaskRecord

__all__ = ["cost_of", "duration_ms", "job_dict", "task_dict"]


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


def duration_ms(record: TaskRecord) -> int | None:
    started = record.raw.get("startedAt")
    if not isinstance(started, int):
        return None
    finished = record.raw.get("finishedAt")
    end = finished if isinstance(finished, int) else now_ms()
    return max(0, end - started)


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
