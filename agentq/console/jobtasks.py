"""A job's tasks as its page draws them: a summary row per task, not whole records.

Batch reads ask for a row's attributes only (a projection, never the task's input),
strongly consistent so a refresh never shows a task going back; a task that can no
longer change (COMPLETED, CANCELLED) keeps its row and is not read again. Unprocessed
keys are asked again a bounded number of times with a growing pause, then the page
answers 502 and the next poll tries again (docs/console.md, "What it reads").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Final

from agentq.errors import AgentqError
from agentq.jobs.spec import TaskSpec, task_request_id
from agentq.jobs.store import JobRecord
from agentq.jobs.summary import cost_of, ended_run_ms
from agentq.states import TaskState
from agentq.store import TaskRecord, keys
from agentq.store.batchread import batch_get

BATCH: Final = 100  # keys per BatchGetItem
ATTEMPTS: Final = 6  # for keys left unprocessed
# What a row is made of (task_row); everything else of the item stays in DynamoDB.
ROW_ATTRIBUTES: Final = ("requestId", "tenant", "state", "attempt", "owner", "createdAt",
                         "startedAt", "finishedAt", "costUsd", "cost_usd", "error",
                         "cancelReason", "definition", "durationMs")  # fmt: skip
_NAMES: Final = {f"#a{i}": name for i, name in enumerate(ROW_ATTRIBUTES)}
_PROJECTION: Final = ", ".join(_NAMES)
FINAL_STATES: Final = frozenset({TaskState.COMPLETED, TaskState.CANCELLED})
MAX_CACHED_ROWS: Final = 50_000

Submit = Callable[..., "Future[Any]"]


class TasksUnreadable(AgentqError):
    """DynamoDB kept leaving some of a page's tasks unread (throttled)."""

    def __init__(self, whose: str, left: int) -> None:
        self.whose = whose  # "job ID", or "recent tasks"
        self.left = left
        super().__init__(f"{whose}: {left} task(s) unread after {ATTEMPTS} attempts")


class JobTasks:
    def __init__(self, dynamodb: Any, table: str, submit: Submit) -> None:
        self._ddb = dynamodb
        self._table = table
        self._submit = submit
        # (tenant, job id, its creation time: a job made again under the same id is
        # another job) → task key → its final row; the least recently read job goes first.
        self._final: OrderedDict[tuple[str, str, int], dict[str, dict[str, Any]]] = OrderedDict()
        self._cached_rows = 0
        self._lock = threading.Lock()

    def rows(self, job: JobRecord) -> list[dict[str, Any]]:
        """Each task's row in the spec's order (NOT_CREATED for a task not created yet)."""
        tenant, job_id, specs = job.tenant, job.job_id, job.spec.tasks
        cache_key = (tenant, job_id, job.created_at_ms)
        with self._lock:
            final = dict(self._final.get(cache_key, {}))
        wanted = [spec.key for spec in specs if spec.key not in final]
        chunks = [
            self._submit(self._read, tenant, job_id, wanted[i : i + BATCH])
            for i in range(0, len(wanted), BATCH)
        ]
        found: dict[str, TaskRecord] = {}
        for chunk in chunks:
            found.update(chunk.result())
        rows, newly_final = [], {}
        for spec in specs:
            row = final.get(spec.key)
            if row is None:
                record = found.get(spec.key)
                row = task_row(spec, record)
                if record is not None and record.state in FINAL_STATES:
                    newly_final[spec.key] = row
            rows.append(row)
        if newly_final:
            self._keep(cache_key, newly_final)
        return rows

    def _read(self, tenant: str, job_id: str, task_keys: Sequence[str]) -> dict[str, TaskRecord]:
        by_request = {task_request_id(job_id, key): key for key in task_keys}
        found = read_states(self._ddb, self._table, tenant, list(by_request), f"job {job_id}")
        return {by_request[rid]: record for rid, record in found.items() if rid in by_request}

    def _keep(self, cache_key: tuple[str, str, int], rows: Mapping[str, dict[str, Any]]) -> None:
        with self._lock:
            kept = self._final.setdefault(cache_key, {})
            before = len(kept)
            kept.update(rows)
            self._cached_rows += len(kept) - before
            self._final.move_to_end(cache_key)
            while self._cached_rows > MAX_CACHED_ROWS and len(self._final) > 1:
                _, dropped = self._final.popitem(last=False)
                self._cached_rows -= len(dropped)


def read_states(
    dynamodb: Any, table: str, tenant: str, request_ids: Sequence[str], whose: str
) -> dict[str, TaskRecord]:
    """The STATE items of up to `BATCH` of a tenant's tasks, by request id (one
    strongly consistent BatchGetItem; keys DynamoDB leaves unprocessed are asked again
    with a back-off, then `TasksUnreadable`). A task with no item is left out."""
    wanted = [keys.state_key(tenant, rid) for rid in dict.fromkeys(request_ids)]
    items, unread = batch_get(
        dynamodb, table, wanted, attempts=ATTEMPTS, base_s=0.05, cap_s=1.0,
        options={"ProjectionExpression": _PROJECTION, "ExpressionAttributeNames": _NAMES},
    )  # fmt: skip
    if unread:
        raise TasksUnreadable(whose, unread)
    records = (TaskRecord.from_item(item) for item in items)
    return {record.request_id: record for record in records}


def task_row(spec: TaskSpec, record: TaskRecord | None) -> dict[str, Any]:
    row: dict[str, Any] = {"key": spec.key, "dependsOn": list(spec.depends_on),
                           "definition": spec.definition}  # fmt: skip
    if record is None:
        return row | {"state": "NOT_CREATED", "attempt": 0}
    return row | state_row(record)


def state_row(record: TaskRecord) -> dict[str, Any]:
    """What a page shows of a task's STATE item (the fields `ROW_ATTRIBUTES` reads)."""
    raw = record.raw
    error = raw.get("error")
    return {
        "requestId": record.request_id,
        "state": record.state.value,
        "attempt": record.attempt,
        "owner": record.owner,
        "createdMs": record.created_at_ms,
        "startedMs": raw.get("startedAt") if isinstance(raw.get("startedAt"), int) else None,
        "finishedMs": raw.get("finishedAt") if isinstance(raw.get("finishedAt"), int) else None,
        "durationMs": ended_run_ms(record),
        "costUsd": cost_of(record),
        "errorCategory": error.get("category") if isinstance(error, Mapping) else None,
        "errorMessage": error.get("message") if isinstance(error, Mapping) else None,
        "cancelReason": raw.get("cancelReason"),
    }
