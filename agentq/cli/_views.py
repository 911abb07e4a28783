"""What producer commands show: records as JSON-able dicts and as rich tables.

Shared by `submit`/`status`/`events`, `job ...`, `definitions ...` and `watch`; kept
apart so every command's `--json` output has one shape.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentq.cli.common import CLI_AWS_CONFIG, EXIT_OK, EXIT_TASK_FAILED
from agentq.errors import InvalidInput
from agentq.events import iso_ms
from agentq.jobs import JobRecord
from agentq.jobs.summary import cost_of, duration_ms, job_dict, task_dict
from agentq.json_text import decode_lenient
from agentq.states import TaskState
from agentq.store import TaskRecord

# Summaries live in agentq.jobs.summary (the API uses them too); commands reach them here.
__all__ = ["cost_of", "duration_ms", "job_dict", "task_dict"]


def make_console() -> Console:
    """Rich reads the terminal's width and colour settings when a console is made."""
    return Console(highlight=False, soft_wrap=True)


console = make_console()


def aws(region: str) -> Any:
    """AWS clients with the command line's short timeouts and few retries."""
    from agentq.aws import AwsClients

    return AwsClients(region, config_options=CLI_AWS_CONFIG)


def client() -> Any:
    from agentq.client import AgentqClient
    from agentq.config import Settings

    settings = Settings.from_env()
    return AgentqClient.from_env(settings, aws=aws(settings.region))


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
    value = decode_lenient(text, name=what)
    if not isinstance(value, dict):
        raise InvalidInput(what, "must be a JSON object")
    return value


# -- tasks ---------------------------------------------------------------------------------
def task_exit_code(state: TaskState) -> int:
    return EXIT_OK if state is TaskState.COMPLETED else EXIT_TASK_FAILED


def print_task(record: TaskRecord, *, waiting: str | None = None) -> None:
    data = task_dict(record)
    rows: dict[str, Any] = {}
    for key, value in data.items():
        rows[key] = value
        if key == "state" and waiting:
            rows["why"] = waiting  # right under the state it explains
    table = Table(show_header=False, box=None)
    for name, value in rows.items():
        if value in (None, ""):
            continue
        if name == "costUsd":
            shown = money(float(value))
        elif name == "durationMs":
            shown = duration(int(value))
        elif name == "error" and isinstance(value, Mapping):
            shown = escape(error_line(value))
        elif name == "resume":
            shown = f"{'on' if value else 'off'} for this task (over its definition's)"
        else:
            shown = _show(value)
        table.add_row(f"[bold]{name}[/bold]", shown)
    console.print(table)


def duration(ms: float) -> str:
    """`40ms` under a second (a quick task is not `0.0s`), else `1.2s`."""
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.1f}s"


def money(usd: float) -> str:
    """Dollars as people read them: 4 decimals below a dollar (a cent's fraction matters
    per task), cents above."""
    return f"${usd:.4f}" if abs(usd) < 1 else f"${usd:,.2f}"


def error_line(error: Mapping[str, Any]) -> str:
    category = error.get("category") or "error"
    kind = error.get("exception_type")
    line = f"{category}: {error.get('message') or ''}".strip()
    return f"{line} [{kind}]" if isinstance(kind, str) and kind else line


def event_detail(payload: Mapping[str, Any]) -> str:
    """The one thing worth reading in an event's payload, as text (never cut here)."""
    parts: list[str] = []
    error = payload.get("error")
    if isinstance(error, Mapping):
        parts.append(error_line(error))
    if payload.get("reason"):
        parts.append(str(payload["reason"]))
    if isinstance(payload.get("retryAt"), int):
        parts.append(f"retry at {iso_ms(payload['retryAt'])[11:19]}")
    cost = payload.get("cost_usd", payload.get("costUsd"))
    if isinstance(cost, int | float):
        parts.append(f"cost {money(float(cost))}")
    if isinstance(payload.get("duration_ms"), int):
        parts.append(duration(payload["duration_ms"]))
    if payload.get("payloadPointer"):
        parts.append("payload stored in S3 (too large for an event)")
    return "; ".join(parts)


def timeline_table(items: Iterable[Mapping[str, Any]], *, title: str | None = None) -> Table:
    """A task's events as one table: the CLI's `events` and the demo draw the same."""
    table = Table("time", "event", "state", "attempt", "worker", "detail", title=title,
                  title_justify="left")  # fmt: skip
    for item in items:
        payload = item.get("payload") or {}
        table.add_row(
            str(item.get("timestamp", ""))[11:23],
            escape(str(item.get("detailType", ""))),
            str(item.get("state") or ""),
            str(item.get("attempt", "")),
            escape(str(item.get("workerId") or "")),
            escape(event_detail(payload)) if isinstance(payload, Mapping) else "",
        )
    return table


def print_events(items: Iterable[Mapping[str, Any]]) -> None:
    console.print(timeline_table(items))


# -- jobs ----------------------------------------------------------------------------------
def job_exit_code(job: JobRecord) -> int:
    return EXIT_OK if job.state == "COMPLETED" else EXIT_TASK_FAILED


def print_job(job: JobRecord, tasks: Mapping[str, TaskRecord | None]) -> None:
    summary = job.to_dict()
    console.print(
        f"[bold]job {job.job_id}[/bold] {escape(summary['name'] or '')}  state={job.state}  "
        f"{job.done}/{job.total} done  policy={job.spec.failure_policy}  "
        f"cost={money(job.cost_usd)}"
    )
    console.print(tasks_table(tasks))
    hint = job_footer(job.job_id, tasks)
    if hint:
        console.print(f"[dim]{escape(hint)}[/dim]")


def job_footer(job_id: str, tasks: Mapping[str, TaskRecord | None]) -> str | None:
    """What `agentq result/status/logs` take (the job's id and the task's key), with the
    command that helps most: why the first failed task failed, else a result."""
    created = [record for record in tasks.values() if record is not None]
    if not created:
        return None
    failed = next((r for r in created if r.state in _FAILED_STATES), None)
    if failed is not None:
        example = f"`agentq status {failed.request_id}` (why it failed, then `agentq logs`)"
    else:
        done = next((r for r in created if r.state is TaskState.COMPLETED), created[0])
        example = f"`agentq result {done.request_id}`"
    return f"a task's request id is {job_id}-KEY, e.g. {example}"


_FAILED_STATES: Final = (TaskState.FAILED, TaskState.TIMEOUT, TaskState.CANCELLED)


def tasks_table(tasks: Mapping[str, TaskRecord | None]) -> Table:
    table = Table("task", "definition", "state", "attempt", "duration", "cost", "note")
    for key, record in tasks.items():
        if record is None:
            table.add_row(escape(key), "", "(not created)", "", "", "", "")
            continue
        ms = duration_ms(record)
        table.add_row(
            escape(key),
            escape(record.definition or ""),
            _styled_state(record.state),
            str(record.attempt),
            duration(ms) if ms is not None else "",
            money(cost_of(record)),
            escape(task_note(record)),
        )
    return table


def recent_table(records: Iterable[TaskRecord]) -> Table:
    """Tasks outside jobs, keyed by request id (what `agentq status ID` takes)."""
    table = Table("request id", "definition", "state", "attempt", "duration", "cost", "note")
    for record in records:
        ms = duration_ms(record)
        table.add_row(
            record.request_id,
            escape(record.definition or ""),
            _styled_state(record.state),
            str(record.attempt),
            duration(ms) if ms is not None else "",
            money(cost_of(record)),
            escape(task_note(record)),
        )
    return table


def task_note(record: TaskRecord) -> str:
    """Why a task is where it is, when that is not obvious from its state."""
    if record.state is TaskState.CANCELLED:
        return str(record.raw.get("cancelReason") or "cancelled")
    error = record.raw.get("error")
    if record.state in (TaskState.FAILED, TaskState.TIMEOUT, TaskState.RETRYING) and isinstance(
        error, Mapping
    ):
        return error_line(error)
    return ""


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
            money(job.cost_usd),
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
