"""`agentq job create|status|list|retry|cancel`: jobs (DAGs of tasks)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, EXIT_WAIT_TIMEOUT, emit_json, fail


def register(subparsers: Any) -> None:
    job = subparsers.add_parser("job", help="create and inspect jobs (DAGs of tasks)")
    commands = job.add_subparsers(dest="job_command", metavar="COMMAND", required=True)

    create = commands.add_parser("create", help="create a job from a YAML/JSON spec")
    create.add_argument("file", type=Path, help="job spec (see docs/jobs.md)")
    create.add_argument("--job-id", help="job id (default: generated; re-running resumes)")
    create.add_argument("--wait", action="store_true", help="wait until the job closes")
    create.add_argument("--timeout", type=float, default=1800.0, help="--wait limit (s)")
    views.add_tenant_flag(create)
    views.add_json_flag(create)
    create.set_defaults(func=_create)

    status = commands.add_parser("status", help="a job and its tasks (exit 4 if it failed)")
    status.add_argument("job_id")
    views.add_tenant_flag(status)
    views.add_json_flag(status)
    status.set_defaults(func=_status)

    listing = commands.add_parser("list", help="the tenant's jobs, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--state", choices=["RUNNING", "COMPLETED", "FAILED"])
    listing.add_argument("--search", metavar="TEXT", help="part of the job id")
    listing.add_argument("--definition", help="jobs with a task of this definition")
    listing.add_argument("--since", help="created at or after (ISO time, UTC)")
    listing.add_argument("--until", help="created at or before (ISO time, UTC)")
    views.add_tenant_flag(listing)
    views.add_json_flag(listing)
    listing.set_defaults(func=_list)

    retry = commands.add_parser(
        "retry", help="run a FAILED or TIMEOUT task of a job again (the job reopens)"
    )
    retry.add_argument("job_id")
    retry.add_argument("key", help="the task's key in the job spec")
    views.add_tenant_flag(retry)
    views.add_json_flag(retry)
    retry.set_defaults(func=_retry)

    cancel = commands.add_parser("cancel", help="cancel every task of a job not yet started")
    cancel.add_argument("job_id")
    views.add_tenant_flag(cancel)
    views.add_json_flag(cancel)
    cancel.set_defaults(func=_cancel)


def _create(args: argparse.Namespace) -> int:
    from agentq.client import WaitTimeout
    from agentq.jobs import load_spec_file

    client = views.client()
    job = client.create_job(load_spec_file(args.file), job_id=args.job_id, tenant=args.tenant)
    if args.wait:
        try:
            job = client.wait(job_id=job.job_id, tenant=job.tenant, timeout_s=args.timeout)
        except WaitTimeout as exc:
            _show(args, client, client.get_job(job.job_id, tenant=job.tenant))
            return fail(str(exc), EXIT_WAIT_TIMEOUT)
        _show(args, client, job)
        return views.job_exit_code(job)
    if args.json:
        emit_json(views.job_dict(job))
    else:
        print(job.job_id)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    client = views.client()
    job = client.get_job(args.job_id, tenant=args.tenant)
    _show(args, client, job)
    return EXIT_OK if job.state == "RUNNING" else views.job_exit_code(job)


def _list(args: argparse.Namespace) -> int:
    from agentq.console.search import parse_filters

    given = {"q": args.search, "definition": args.definition, "since": args.since,
             "until": args.until, "state": args.state}  # fmt: skip
    found = parse_filters(
        {k: v for k, v in given.items() if v}, states=("RUNNING", "COMPLETED", "FAILED")
    )
    client = views.client()
    jobs, _ = client.jobs.page(
        args.tenant or client.settings.tenant_id, limit=args.limit, state=args.state,
        since_ms=found.since_ms, until_ms=found.until_ms, id_contains=found.text,
        definition=found.definition,
    )  # fmt: skip
    if args.json:
        emit_json([views.job_dict(job) for job in jobs])
    else:
        views.console.print(views.jobs_table(jobs))
    return EXIT_OK


def _retry(args: argparse.Namespace) -> int:
    answer = views.client().retry(args.job_id, args.key, tenant=args.tenant)
    if args.json:
        emit_json(answer.to_dict())
    else:
        print(f"{answer.request_id} is {answer.state} again; job is {answer.job_state}")
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    client = views.client()
    cancelled = [a.request_id for a in client.cancel(job_id=args.job_id, tenant=args.tenant)]
    job = client.get_job(args.job_id, tenant=args.tenant)
    if args.json:
        emit_json({"cancelled": cancelled, "job": views.job_dict(job)})
    else:
        print(f"cancelled {len(cancelled)} task(s); job is {job.state}")
    return EXIT_OK


def _show(args: argparse.Namespace, client: Any, job: Any) -> None:
    tasks = client.job_tasks(job)
    if args.json:
        emit_json(views.job_dict(job, tasks))
    else:
        views.print_job(job, tasks)
