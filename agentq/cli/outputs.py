"""`agentq result`, `agentq logs`, `agentq trace [--conversation]`: what a task left behind.

The S3 locations come from the producer client (`AgentqClient.result/logs/trace`),
never from keys built here, so a change of layout flows through one function.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Final

from rich.markup import escape

from agentq.cli import _views as views
from agentq.cli._conversation_view import print_conversation
from agentq.cli._trace_view import is_worker_trace, print_trace
from agentq.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_TASK_FAILED, emit_json, fail
from agentq.errors import NoOutputYet
from agentq.states import TaskState

# Task output is untrusted: a log line must not move the cursor or retitle the terminal.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def register(subparsers: Any) -> None:
    for name, handler, text in (
        ("result", _result, "a completed task's result (its JSON output)"),
        ("logs", _logs, "a task's log files (summary, CLI stderr, error record)"),
        ("trace", _trace, "an agent task's session trace (tool calls, turns, tokens)"),
    ):
        command = subparsers.add_parser(name, help=text)
        command.add_argument("request_id")
        views.add_tenant_flag(command)
        views.add_json_flag(command)
        command.set_defaults(func=handler)
        if name == "trace":
            command.add_argument(
                "--conversation", action="store_true",
                help="the session itself: prompt, messages, tool calls and results, by attempt",
            )  # fmt: skip


def terminal_safe(text: str) -> str:
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text)


def _result(args: argparse.Namespace) -> int:
    client = views.client()
    record = client.get_task(args.request_id, tenant=args.tenant)
    if record.state.terminal and record.state is not TaskState.COMPLETED:
        # It ended without a result: exit 4, as `status` and `--wait` say of such a task
        # (3 would send the operator looking for a wrong id or tenant).
        return fail(f"task {args.request_id} ended {record.state.value}: no result",
                    EXIT_TASK_FAILED, hint=f"`agentq status {args.request_id}` says why")  # fmt: skip
    if not record.state.terminal:
        return fail(f"task {args.request_id} is {record.state.value}: no result yet",
                    EXIT_NOT_FOUND,
                    hint=f"it has not finished; `agentq status {args.request_id}` shows where "
                         "it is")  # fmt: skip
    output = client.result(args.request_id, tenant=args.tenant)
    if args.json:
        emit_json(output)
    else:
        views.console.print_json(data=output)
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    try:
        files = views.client().logs(args.request_id, tenant=args.tenant)
    except NoOutputYet as early:
        return _not_yet(args, early, {})
    if args.json:
        emit_json(files)
        return EXIT_OK
    for name, text in files.items():
        views.console.rule(escape(name), align="left")
        if text.strip():
            views.console.out(terminal_safe(text), highlight=False)
        else:
            views.console.print("[dim](empty)[/dim]")
    return EXIT_OK


def _trace(args: argparse.Namespace) -> int:
    if args.conversation:
        return _conversation(args)
    try:
        trace = views.client().trace(args.request_id, tenant=args.tenant)
    except NoOutputYet as early:
        return _not_yet(args, early, None)
    if args.json:
        emit_json(trace)
    elif is_worker_trace(trace):
        print_trace(views.console, trace, terminal_safe)
    else:
        views.console.print_json(data=trace)
    return EXIT_OK


def _conversation(args: argparse.Namespace) -> int:
    conversation = views.client().conversation(args.request_id, tenant=args.tenant)
    if args.json:
        emit_json(conversation.to_dict())
    else:
        print_conversation(views.console, args.request_id, conversation, terminal_safe)
    return EXIT_OK


def _not_yet(args: argparse.Namespace, early: NoOutputYet, empty: Any) -> int:
    # Asked too early is an answer, not an error: the task is there and live.
    if args.json:
        emit_json(empty)
    else:
        views.console.print(f"[dim]{escape(str(early))}; `agentq status {escape(early.key)}` "
                            "says why it waits[/dim]")  # fmt: skip
    return EXIT_OK
