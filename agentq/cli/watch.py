"""`agentq watch [JOB_ID]`: a live view of a job, or of the tenant's recent work.

The view redraws every `--interval` seconds from the job item and the tasks' STATE
items: tasks by state, a progress bar, durations and cost so far. Without a job id it
shows the tenant's recent jobs and the tasks submitted on their own (`agentq submit`).
Watching a job ends when it closes, with the job's exit code (0 completed, 4 failed);
`--once` and `--json` draw one frame and exit with the same code.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, EXIT_WAIT_TIMEOUT, emit_json, fail
from agentq.events import now_ms


def register(subparsers: Any) -> None:
    watch = subparsers.add_parser("watch", help="live view of a job or of recent work")
    watch.add_argument("job_id", nargs="?", help="the job to follow (default: recent work)")
    watch.add_argument("--interval", type=float, default=2.0, help="refresh every N seconds")
    watch.add_argument("--timeout", type=float, default=None, help="stop after N seconds")
    watch.add_argument("--once", action="store_true", help="draw one frame and exit")
    watch.add_argument(
        "--since", type=float, default=60.0, help="recent work: the last N minutes (default 60)"
    )
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
        return _exit_code(job)
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


def _exit_code(job: Any) -> int:
    # The same answer as `agentq job status`: a closed job that failed is exit 4.
    if job is None or job.state == "RUNNING":
        return EXIT_OK
    return views.job_exit_code(job)


def _snapshot(client: Any, args: argparse.Namespace) -> tuple[Any, RenderableType, Any]:
    if args.job_id is None:
        since = now_ms() - int(args.since * 60_000)
        jobs = client.list_jobs(tenant=args.tenant, limit=20)
        tasks = client.recent_tasks(tenant=args.tenant, since_ms=since)
        data = {"jobs": [views.job_dict(j) for j in jobs],
                "tasks": [views.task_dict(t) for t in tasks]}  # fmt: skip
        return None, recent_frame(jobs, tasks, args), data
    job = client.get_job(args.job_id, tenant=args.tenant)
    tasks_by_key = client.job_tasks(job)
    return job, job_frame(job, tasks_by_key), views.job_dict(job, tasks_by_key)


def recent_frame(jobs: list[Any], tasks: list[Any], args: argparse.Namespace) -> RenderableType:
    tenant = args.tenant or client_tenant()
    if not jobs and not tasks:
        return Text.from_markup(
            f"No jobs, and no tasks in the last {args.since:g} min, for tenant "
            f"[bold]{escape(tenant)}[/bold].\n"
            'Submit one:  agentq submit sample-echo --input \'{"hello": "agentq"}\'\n'
            "Or a job:    agentq job create examples/job.yaml\n"
            "Work submitted through the producer API lives under the tenant its caller's "
            "IAM principal is mapped to (agentq tenants list): add --tenant TENANT."
        )
    parts: list[RenderableType] = []
    if jobs:
        parts += [Text("jobs", style="bold"), views.jobs_table(jobs)]
    if tasks:
        parts += [Text("tasks submitted on their own", style="bold"), views.recent_table(tasks)]
    return Group(*parts)


def client_tenant() -> str:
    from agentq.config import Settings

    return Settings.from_env().tenant_id


def job_frame(job: Any, tasks: dict[str, Any]) -> RenderableType:
    by_state = Counter(record.state.value if record else "NOT CREATED" for record in tasks.values())
    header = Text.assemble(
        (f"job {job.job_id}", "bold"),
        f"  {job.spec.name or ''}  {job.state}  policy={job.spec.failure_policy}  ",
        (f"cost so far {views.money(job.cost_usd + _running_cost(tasks))}", "bold"),
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
