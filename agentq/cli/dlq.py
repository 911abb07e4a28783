"""`agentq dlq list` and `agentq dlq redrive`: inspect and replay dead-lettered tasks.

The dlq-processor archives every dead letter to S3 and closes out its task; these
commands read that archive (and, with `--peek`, the DLQ itself) and replay archived
messages onto the task queue with a fresh attempt budget, so the task runs again.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from agentq.cli import _views as views
from agentq.cli.common import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_OK, emit_json, fail
from agentq.config import Settings
from agentq.dlq import DlqArchive, Redriver, peek
from agentq.envelope import validate_request_id
from agentq.publisher import EventPublisher
from agentq.store import TaskStore


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dlq", help="list and redrive dead-lettered tasks", description=__doc__
    )
    commands = parser.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND", required=True)

    listing = commands.add_parser("list", help="archived dead letters (newest last)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.add_argument(
        "--peek", action="store_true", help="also show messages still waiting in the DLQ"
    )
    listing.set_defaults(func=_list)

    redrive = commands.add_parser(
        "redrive", help="replay archived messages onto the task queue; the task runs again"
    )
    target = redrive.add_mutually_exclusive_group(required=True)
    target.add_argument("request_id", nargs="?", metavar="REQUEST_ID", help="one task")
    target.add_argument("--all", action="store_true", help="every task not redriven yet")
    redrive.add_argument("--json", action="store_true", help="machine-readable output")
    redrive.set_defaults(func=_redrive)


def _list(args: argparse.Namespace) -> int:
    settings = Settings.from_env().require("bucket")
    clients = views.aws(settings.region)
    messages = DlqArchive(clients.s3, settings.required("bucket")).list()
    waiting = peek(clients.sqs, settings.required("dlq_url")) if args.peek else []
    if args.json:
        data: dict[str, Any] = {
            "archived": [
                {k: v for k, v in asdict(m).items() if k not in ("body", "attributes")}
                for m in messages
            ]
        }
        if args.peek:
            data["waiting"] = [asdict(m) for m in waiting]
        emit_json(data)
        return EXIT_OK
    if not messages:
        print("no archived dead letters")
    for m in messages:
        redriven = f"redriven {_when(m.redriven_at_ms)}" if m.redriven_at_ms else "not redriven"
        print(f"{_when(m.archived_at_ms)}  {m.tenant or '-'}/{m.request_id or '-'}  "
              f"{m.outcome}  {redriven}  receives={m.system_attributes.get('ApproximateReceiveCount', '?')}")  # fmt: skip
        if m.detail:
            print(f"    {m.detail}")
    if args.peek:
        print(f"{len(waiting)} message(s) waiting in the DLQ (not yet processed)")
        for letter in waiting:
            print(f"    {letter.message_id}  requestId={letter.request_id_hint() or '?'}")
    return EXIT_OK


def _redrive(args: argparse.Namespace) -> int:
    settings = Settings.from_env().require("bucket", "queue_url", "table_name", "bus_name")
    clients = views.aws(settings.region)
    bucket = settings.required("bucket")
    redriver = Redriver(
        sqs=clients.sqs,
        queue_url=settings.required("queue_url"),
        tasks=TaskStore(clients.dynamodb, settings.required("table_name")),
        archive=DlqArchive(clients.s3, bucket),
        publisher=EventPublisher(clients.events, bus_name=settings.required("bus_name"),
                                 source=settings.app_name, s3_client=clients.s3, bucket=bucket),
    )  # fmt: skip
    if args.all:
        results = redriver.redrive_all()
    else:
        results = redriver.redrive_request(validate_request_id(args.request_id))
        if not results:
            return fail(f"no archived dead letter to redrive for {args.request_id!r}",
                        EXIT_NOT_FOUND)  # fmt: skip
    if args.json:
        emit_json({"results": [asdict(r) for r in results]})
    else:
        for r in results:
            print(f"{r.outcome}: {r.request_id or '-'}  {r.detail}")
        if not results:
            print("nothing to redrive")
    skipped = [r for r in results if r.outcome == "skipped"]
    # A single named task that could not be replayed is an error for scripts.
    return EXIT_ERROR if skipped and not args.all else EXIT_OK


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
