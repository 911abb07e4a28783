"""`agentq watch [JOB_ID]`: a live view of a job (or of the tenant's recent jobs).

The view redraws every `--interval` seconds from the job item and the tasks' STATE
items: tasks by state, a progress bar, durations and cost so far. Watching a job
ends when it closes, with the job's exit code (0 completed, 4 failed).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, EXIT_WAIT_TIMEOUT, emit_json, fail


def register(subparsers: Any) -> None:
    watch = subparsers.add_parser("watch", help="live view of a job or of recent jobs")
    watch.add_argument("job_id", nargs="?", help="the job to follow (default: recent jobs)")
    watch.add_argument("--interval", type=float, default=2.0, help="refresh every N seconds")
    watch.add_argument("--timeout", type=float, default=None, help="stop after N seconds")
    watch.add_argument("--once", action="store_true", help="draw one frame and exit")
    views.add_tenant_flag(watch)
    views.add_json_flag(watch)
    watch.set_defaults(func=_watch)


def _watch(args: argparse.Namespace) -> int:
    client = views.client()
    if args.json or args.once:
        job, frame, data = _snapshot(client, args)
        if args.json:
            emit_json(data)
        else:
            views.console.print(frame)
        return EXIT_OK
    deadline = time.monotonic() + args.timeout if args.timeout else None
    with Live(console=views.console, auto_refresh=False) as live:
        while True:
            job, frame, _ = _snapshot(client, args)
            live.update(frame, refresh=True)
            if job is not None and job.state != "RUNNING":
                return views.job_exit_code(job)
            if deadline is not None and time.monotonic() >= deadline:
                return fail("watch timed out", EXIT_WAIT_TIMEOUT) if job else EXIT_OK
            time.sleep(args.interval)


def _snapshot(client: Any, args: argparse.Namespace) -> tuple[Any, RenderableType, Any]:
    if args.job_id is None:
        jobs = client.list_jobs(tenant=args.tenant, limit=20)
        return None, views.jobs_table(jobs), [views.job_dict(j) for j in jobs]
    job = client.get_job(args.job_id, tenant=args.tenant)
    tasks = client.job_tasks(job)
    return job, job_frame(job, tasks), views.job_dict(job, tasks)


def job_frame(job: Any, tasks: dict[str, Any]) -> RenderableType:
    by_state = Counter(record.state.value if record else "NOT CREATED" for record in tasks.values())
    header = Text.assemble(
        (f"job {job.job_id}", "bold"),
        f"  {job.spec.name or ''}  {job.state}  policy={job.spec.failure_policy}  ",
        (f"cost so far ${job.cost_usd + _running_cost(tasks):.4f}", "bold"),
    )
    counts = Table.grid(padding=(0, 2))
    counts.add_row(*(f"{state}: {n}" for state, n in sorted(by_state.items())))
    progress = Table.grid(padding=(0, 1))
    progress.add_row(
        ProgressBar(total=max(job.total, 1), completed=job.done, width=40),
        Text(f"{job.done}/{job.total} done"),
    )
    return Group(header, counts, progress, views.tasks_table(tasks))


def _running_cost(tasks: dict[str, Any]) -> float:
    # Terminal tasks' cost is already on the job item's counter.
    return sum(views.cost_of(r) for r in tasks.values() if r and not r.state.terminal)
