"""What the console shows, read through agentq's own client and stores.

Every page is one JSON document built here: the jobs list (one index query per page),
a job (the job item, its tasks' summaries from agentq.console.jobtasks, its event
timeline) and a task (STATE item, timeline, artifacts). Ids and filters come from the browser and are
validated before any AWS call; an unknown id is `NotFound` (a 404 page).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, cast, get_args

from agentq.client import AgentqClient
from agentq.console.artifacts import TaskArtifacts
from agentq.console.cursor import decode_cursor, encode_cursor
from agentq.console.jobhead import JobHeads
from agentq.console.jobtasks import JobTasks
from agentq.console.search import Filters
from agentq.console.standalone import StandaloneTasks
from agentq.envelope import TENANT_PATTERN, validate_request_id
from agentq.errors import InvalidInput
from agentq.jobs.spec import validate_job_id
from agentq.jobs.store import JobRecord, JobState
from agentq.jobs.summary import job_dict, task_dict
from agentq.waits import explain_wait

MAX_PAGE: Final = 200
READ_THREADS: Final = 8
_PAGE_SIZE: Final = re.compile(r"[0-9]{1,4}")
JOB_STATES: Final = get_args(JobState)
_ENDING_STATES: Final = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")


def validate_tenant(value: object) -> str:
    if not isinstance(value, str) or not TENANT_PATTERN.fullmatch(value):
        raise InvalidInput("tenant", f"must match {TENANT_PATTERN.pattern}")
    return value


def page_size(value: object, default: int = 50) -> int:
    if value in (None, ""):
        return default
    # Not str.isdigit: it admits digits such as "²" that int() refuses.
    if (
        not isinstance(value, str)
        or not _PAGE_SIZE.fullmatch(value)
        or not 1 <= int(value) <= MAX_PAGE
    ):
        raise InvalidInput("limit", f"a whole number from 1 to {MAX_PAGE}")
    return int(value)


def job_state_filter(value: object) -> JobState | None:
    if value in (None, "", "ALL"):
        return None
    if value not in JOB_STATES:
        raise InvalidInput("state", f"one of {', '.join(JOB_STATES)}")
    return cast(JobState, value)


class ConsoleReader:
    def __init__(self, client: AgentqClient, artifacts: TaskArtifacts) -> None:
        self.client = client
        self.artifacts = artifacts
        # A job's reads are independent of one another once its item is read: its tasks
        # (one BatchGetItem per 100) and its timeline go out together, so a 1,000-task
        # job costs about one round trip more than a 10-task one, not ten.
        self._pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="console-read")
        self._heads = JobHeads(client)
        self._tasks = JobTasks(client.dynamodb, client.settings.required("table_name"),
                               self._pool.submit)  # fmt: skip
        self._standalone = StandaloneTasks(client)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def default_tenant(self) -> str:
        return self.client.settings.tenant_id

    # -- jobs ------------------------------------------------------------------------
    def jobs(
        self,
        *,
        tenant: str,
        state: JobState | None,
        cursor: str | None,
        limit: int,
        filters: Filters | None = None,
    ) -> dict[str, Any]:
        start = decode_cursor(cursor, tenant) if cursor else None
        found = filters or Filters()
        records, last = self.client.jobs.page(
            tenant, limit=limit, start=start, state=state, since_ms=found.since_ms,
            until_ms=found.until_ms, id_contains=found.text, definition=found.definition,
        )  # fmt: skip
        return {
            "tenant": tenant,
            "state": state,
            "filters": found.echo() | {"state": state},
            "jobs": [_job_row(job) for job in records],
            "next": encode_cursor(last) if last else None,
        }

    def job(self, tenant: str, job_id: str) -> dict[str, Any]:
        job = self._heads.get(tenant, validate_job_id(job_id))
        # The timeline goes out beside the tasks' batch reads: one round trip for all.
        events = self._pool.submit(self.client.event_store.job_timeline, job.tenant, job.job_id)
        rows = self._tasks.rows(job)
        timeline = events.result()
        return {
            "job": _job_row(job),
            "tasks": rows,
            "events": [_event_row(e) for e in timeline],
            "why": why_it_ended(job, rows),
        }

    # -- tasks -----------------------------------------------------------------------
    def tasks(self, tenant: str, filters: Filters | None = None) -> dict[str, Any]:
        """The tenant's newest tasks submitted on their own, or those matching `filters`
        (agentq.console.standalone)."""
        return self._standalone.page(tenant, filters)

    def task(self, tenant: str, request_id: str) -> dict[str, Any]:
        record = self.client.get_task(validate_request_id(request_id), tenant=tenant)
        events = self.client.events(record.request_id, tenant=record.tenant)
        envelope = record.envelope or {}
        return {
            "task": task_dict(record) | {"cancelReason": record.raw.get("cancelReason")},
            "waiting": explain_wait(self.client, record),
            "input": envelope.get("input"),
            "error": record.raw.get("error"),
            "usage": record.raw.get("usage"),
            "events": [_event_row(e) for e in events],
            "attempts": attempts_of(events),
            "artifacts": self.artifacts.of(record),
        }

    def conversation(self, tenant: str, request_id: str) -> dict[str, Any]:
        """An agent task's turns across attempts (agentq.conversation: scrubbed, capped);
        loaded by the task page after it is drawn, never embedded in it."""
        found = self.client.conversation(validate_request_id(request_id), tenant=tenant)
        return found.to_dict()

    def raw_object(self, tenant: str, request_id: str, key: str) -> tuple[bytes, bool]:
        record = self.client.get_task(validate_request_id(request_id), tenant=tenant)
        return self.artifacts.raw(record, key)


def _job_row(job: JobRecord) -> dict[str, Any]:
    return job_dict(job) | {
        "createdMs": job.created_at_ms,
        "closedMs": job.closed_at_ms,
        "taskCount": len(job.spec.tasks),
    }


def _event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("eventId", "detailType", "timestamp", "timestampMs", "attempt", "workerId",
            "state", "effectiveUntil", "payload", "payloadPointer")  # fmt: skip
    return {name: event.get(name) for name in keep}


def attempts_of(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each attempt from the timeline: who ran it, when, how it ended, its lease."""
    attempts: dict[int, dict[str, Any]] = {}
    for event in events:
        number = event.get("attempt")
        if not isinstance(number, int) or number < 1:
            continue
        entry = attempts.setdefault(number, {"attempt": number})
        kind, at = event.get("detailType"), event.get("timestampMs")
        if kind == "Task Processing Started":
            entry.update(worker=event.get("workerId"), startedMs=at,
                         leaseUntil=event.get("effectiveUntil"))  # fmt: skip
        elif kind in ("Task Completed", "Task Failed", "Task Timeout", "Task Processing Failed"):
            payload = event.get("payload") or {}
            error = payload.get("error") if isinstance(payload, Mapping) else None
            entry.update(endedMs=at, exit=kind, worker=entry.get("worker") or event.get("workerId"))
            ran = payload.get("duration_ms") if isinstance(payload, Mapping) else None
            if isinstance(ran, int | float) and not isinstance(ran, bool):
                # The worker's own measure of the child's run, as status and stats show.
                entry["durationMs"] = int(ran)
            if isinstance(error, Mapping):
                entry.update(category=error.get("category"),
                             fenced=error.get("exception_type") in ("LeaseFenced", "LeaseExpired"))  # fmt: skip
        if entry.get("startedMs") and entry.get("endedMs") and "durationMs" not in entry:
            entry["durationMs"] = entry["endedMs"] - entry["startedMs"]
    return [attempts[n] for n in sorted(attempts)]


def why_it_ended(job: JobRecord, rows: list[dict[str, Any]]) -> str:
    by_state: dict[str, list[str]] = {}
    for row in rows:
        by_state.setdefault(str(row["state"]), []).append(str(row["key"]))
    if job.state == "RUNNING":
        ended = sum(len(by_state.get(s, [])) for s in _ENDING_STATES)
        return f"running: {ended} of {job.total} tasks finished, {len(rows) - ended} still to run"
    if job.state == "COMPLETED":
        return f"completed: all {job.total} tasks completed"
    reasons = []
    for state in ("FAILED", "TIMEOUT"):
        for key in by_state.get(state, [])[:5]:
            row = next(r for r in rows if r["key"] == key)
            category = row.get("errorCategory") or state.lower()
            reasons.append(f"{key} {state.lower()} ({category})")
    cancelled = len(by_state.get("CANCELLED", []))
    text = f"failed under policy {job.spec.failure_policy}: " + (
        ", ".join(reasons) or "no task failed"
    )
    if cancelled:
        text += f"; {cancelled} dependent task(s) cancelled"
    return text
