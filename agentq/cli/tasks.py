"""`agentq submit`, `agentq status`, `agentq events`, `agentq cancel`: single tasks."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentq.cli import _views as views
from agentq.cli.common import EXIT_INVALID, EXIT_OK, EXIT_WAIT_TIMEOUT, emit_json, fail
from agentq.store import TaskRecord
from agentq.waits import explain_wait


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser("submit", help="queue one task")
    submit.add_argument("definition", help="task definition name")
    submit.add_argument("--input", dest="input_json", help="task input as a JSON object")
    submit.add_argument("--input-file", type=Path, help="task input from a JSON file")
    submit.add_argument(
        "--idempotency-key", help="same key twice → the same task (nothing sent twice)"
    )
    submit.add_argument("--job", dest="job_id", help="add the task to this running job")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="run no sooner than this many seconds from now")
    when.add_argument(
        "--not-before", help="run no sooner than this time (ISO 8601 with a zone, or epoch s)"
    )
    submit.add_argument(
        "--priority", help="priority tier (PRIORITIES; default: the definition's, else normal)"
    )
    submit.add_argument(
        "--continue",
        dest="continues",
        metavar="REQUEST_ID",
        help="start from this completed agent task's final session (needs --prompt)",
    )
    submit.add_argument(
        "--prompt", help="the follow-up: the next user turn of the session --continue names"
    )
    submit.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an agent task: resume (or not, --no-resume) its session on a retry, whatever "
        "its definition's resume (default: the definition decides)",
    )
    submit.add_argument("--wait", action="store_true", help="wait until the task is terminal")
    submit.add_argument("--timeout", type=float, default=600.0, help="--wait limit (s)")
    views.add_tenant_flag(submit)
    views.add_json_flag(submit)
    submit.set_defaults(func=_submit)

    status = subparsers.add_parser("status", help="a task's state (exit 0 completed, 4 failed)")
    status.add_argument("request_id")
    status.add_argument("--result", action="store_true", help="include the task's result")
    views.add_tenant_flag(status)
    views.add_json_flag(status)
    status.set_defaults(func=_status)

    events = subparsers.add_parser("events", help="a task's event timeline")
    events.add_argument("request_id")
    views.add_tenant_flag(events)
    views.add_json_flag(events)
    events.set_defaults(func=_events)

    cancel = subparsers.add_parser(
        "cancel", help="cancel a task (a running one is stopped within one heartbeat)"
    )
    cancel.add_argument("request_id")
    views.add_tenant_flag(cancel)
    views.add_json_flag(cancel)
    cancel.set_defaults(func=_cancel)


def _submit(args: argparse.Namespace) -> int:
    from agentq.client import WaitTimeout

    client = views.client()
    task_input = views.read_json_argument(args.input_json, args.input_file, "--input")
    record = client.submit(
        args.definition,
        task_input,
        job_id=args.job_id,
        idempotency_key=args.idempotency_key,
        tenant=args.tenant,
        delay=args.delay,
        not_before=args.not_before,
        priority=args.priority,
        continues=args.continues,
        prompt=args.prompt,
        resume=args.resume,
    )
    if args.idempotency_key and _other_work(record, args.definition, task_input):
        views.warn(
            "warning: a task with this idempotency key exists already, with another "
            "definition or input; it is returned as it was (new work needs a new key)"
        )
    if args.wait:
        try:
            record = client.wait(record.request_id, tenant=record.tenant, timeout_s=args.timeout)
        except WaitTimeout as exc:
            _show_task(args, client.get_task(record.request_id, tenant=record.tenant))
            return fail(str(exc), EXIT_WAIT_TIMEOUT)
        _show_task(args, record)
        return views.task_exit_code(record.state)
    if args.json:
        emit_json(views.task_dict(record))
    else:
        print(record.request_id)
    return EXIT_OK


def _other_work(record: TaskRecord, definition: str, task_input: Mapping[str, Any]) -> bool:
    """Whether the task a key found was submitted with something else than this call."""
    envelope = record.envelope or {}
    return bool(envelope) and (
        envelope.get("definition") != definition or envelope.get("input") != dict(task_input)
    )


def _status(args: argparse.Namespace) -> int:
    client = views.client()
    record = client.get_task(args.request_id, tenant=args.tenant)
    data = views.task_dict(record)
    data["waiting"] = explain_wait(client, record)
    if args.result and record.state.value == "COMPLETED":
        data["output"] = client.results.load(record)
    if args.json:
        emit_json(data)
    else:
        views.print_task(record, waiting=data["waiting"])
        if "output" in data:
            views.console.print_json(data=data["output"])
    if not record.state.terminal:
        return EXIT_OK
    return views.task_exit_code(record.state)


def _events(args: argparse.Namespace) -> int:
    client = views.client()
    items = client.events(args.request_id, tenant=args.tenant)
    if not items:
        client.get_task(args.request_id, tenant=args.tenant)  # NotFound → exit 3
    if args.json:
        emit_json(items)
    else:
        views.print_events(items)
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    from agentq.errors import NotCancellable

    client = views.client()
    try:
        [answer] = client.cancel(args.request_id, tenant=args.tenant)
    except NotCancellable as exc:
        return fail(f"{exc.request_id} is already {exc.state}: nothing to cancel", EXIT_INVALID)
    record = client.get_task(args.request_id, tenant=args.tenant)
    # A running task is only asked to stop: it is CANCELLED once its worker has acted.
    outcome = "cancelled" if answer.outcome == "cancelled" else "cancel requested"
    if args.json:
        emit_json({"outcome": outcome, "task": views.task_dict(record)})
    else:
        print(f"{outcome}: {args.request_id}")
    return EXIT_OK


def _show_task(args: argparse.Namespace, record: Any) -> None:
    if args.json:
        emit_json(views.task_dict(record))
    else:
        views.print_task(record)
