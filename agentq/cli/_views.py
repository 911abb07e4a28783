"""What producer commands show: records as JSON-able dicts and as rich tables.

Shared by `submit`/`status`/`events`, `job ...`, `definitions ...` and `watch`; kept
apart so every command's `--json` output has one shape.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentq.cli.common import EXIT_OK, EXIT_TASK_FAILED
from agentq.errors import InvalidInput
from agentq.events import iso_ms
from agentq.jobs import JobRecord
from agentq.jobs.summary import cost_of, duration_ms, job_dict, task_dict
from agentq.states import TaskState
from agentq.store import TaskRecord

# Summaries live in agentq.jobs.summary (the API uses them too); commands reach them here.
__all__ = ["cost_of", "duration_ms", "job_dict", "task_dict"]

console = Console(highlight=False, soft_wrap=True)


def client() -> Any:
    from agentq.client import AgentqClient

    return AgentqClient.from_env()


def add_json_flag(parser: Any) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_tenant_flag(parser: Any) -> None:
    parser.add_argument("--tenant", help="tenant (default TENANT_ID)")


def read_json_argument(text: str | None, path: Path | None, what: str) -> dict[str, Any]:
    if text is not None and path is not None:
        raise InvalidInput(what, "give the JSON inline or as a file, not both")
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidInput(str(path), f"cannot read: {exc.strerror}") from None
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(what, f"not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(value, dict):
        raise InvalidInput(what, "must be a JSON object")
    return value


# -- tasks ---------------------------------------------------------------------------------
def task_exit_code(state: TaskState) -> int:
    return EXIT_OK if state is TaskState.COMPLETED else EXIT_TASK_FAILED


def print_task(record: TaskRecord) -> None:
    data = task_dict(record)
    table = Table(show_header=False, box=None)
    for name, value in data.items():
        if value not in (None, ""):
            table.add_row(f"[bold]{name}[/bold]", _show(value))
    console.print(table)


def print_events(items: Iterable[Mapping[str, Any]]) -> None:
    table = Table("time", "event", "state", "attempt", "worker", "details")
    for item in items:
        payload = item.get("payload") or {}
        table.add_row(
            str(item.get("timestamp", "")),
            str(item.get("detailType", "")),
            str(item.get("state") or ""),
            str(item.get("attempt", "")),
            str(item.get("workerId") or ""),
            _show(payload) if payload else "",
        )
    console.print(table)


# -- jobs ----------------------------------------------------------------------------------
def job_exit_code(job: JobRecord) -> int:
    return EXIT_OK if job.state == "COMPLETED" else EXIT_TASK_FAILED


def print_job(job: JobRecord, tasks: Mapping[str, TaskRecord | None]) -> None:
    summary = job.to_dict()
    console.print(
        f"[bold]job {job.job_id}[/bold] {escape(summary['name'] or '')}  state={job.state}  "
        f"{job.done}/{job.total} done  policy={job.spec.failure_policy}  "
        f"cost=${job.cost_usd:.4f}"
    )
    console.print(tasks_table(tasks))


def tasks_table(tasks: Mapping[str, TaskRecord | None]) -> Table:
    table = Table("task", "definition", "state", "attempt", "duration", "cost")
    for key, record in tasks.items():
        if record is None:
            table.add_row(key, "", "(not created)", "", "", "")
            continue
        ms = duration_ms(record)
        table.add_row(
            key,
            record.definition or "",
            _styled_state(record.state),
            str(record.attempt),
            f"{ms / 1000:.1f}s" if ms is not None else "",
            f"${cost_of(record):.4f}",
        )
    return table


def jobs_table(jobs: Iterable[JobRecord]) -> Table:
    table = Table("job", "name", "state", "progress", "failed", "created", "cost")
    for job in jobs:
        failed = job.counts.get("failed", 0) + job.counts.get("timedOut", 0)
        table.add_row(
            job.job_id,
            escape(job.spec.name or ""),
            job.state,
            f"{job.done}/{job.total}",
            str(failed),
            iso_ms(job.created_at_ms),
            f"${job.cost_usd:.4f}",
        )
    return table


def _styled_state(state: TaskState) -> str:
    colour = {
        TaskState.COMPLETED: "green",
        TaskState.FAILED: "red",
        TaskState.TIMEOUT: "red",
        TaskState.CANCELLED: "yellow",
        TaskState.PROCESSING: "cyan",
        TaskState.RETRYING: "magenta",
    }.get(state)
    return f"[{colour}]{state.value}[/{colour}]" if colour else state.value


def _iso(value: object) -> str | None:
    return iso_ms(value) if isinstance(value, int) else None


def _show(value: Any) -> str:
    # User data may contain [brackets] that rich would read as markup.
    if isinstance(value, str):
        return escape(value)
    return escape(json.dumps(value, default=str, separators=(",", ":")))


def warn(message: str) -> None:
    sys.stderr.write(f"agentq: {message}\n")
