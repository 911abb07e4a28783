"""`agentq stats`: queues, rates, processing time and consumers per tier and per tenant.

The figures and their JSON shape are agentq.stats's (docs/operations.md, "agentq
stats"); this module only parses the arguments and draws the tables.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json

# The figures' names in agentq.stats, and the short headers the tables give them.
_RATE_HEADERS = {"claims": "claimed", "completions": "done", "failures": "failed",
                 "retries": "retried", "timeouts": "timeouts"}  # fmt: skip


def register(subparsers: Any) -> None:
    from agentq.stats import DEFAULT_WINDOW

    parser = subparsers.add_parser(
        "stats",
        help="queue depth, rates, processing time and consumers per tier and tenant",
        description=__doc__,
    )
    parser.add_argument(
        "--window",
        default=DEFAULT_WINDOW,
        help=f"how far back rates and processing times reach: 90s, 15m, 2h, 1d ({DEFAULT_WINDOW})",
    )
    views.add_json_flag(parser)
    parser.set_defaults(func=_stats)


def _stats(args: argparse.Namespace) -> int:
    from agentq.config import Settings
    from agentq.stats import StatsReader, parse_window

    window_s = parse_window(args.window)
    settings = Settings.from_env().require("queue_url", "table_name")
    clients = views.aws(settings.region)
    reader = StatsReader(
        settings,
        sqs=clients.sqs,
        dynamodb=clients.dynamodb,
        cloudwatch=None if settings.local else clients.get("cloudwatch"),
    )
    data = reader.read(window_s)
    if args.json:
        emit_json(data)
        return EXIT_OK
    _draw(data, args.window)
    return EXIT_OK


def _draw(data: dict[str, Any], window: str) -> None:
    # Four narrow tables, not two wide ones: each reads in an 80-column terminal.
    now = _table(f"agentq {data['stage']}: per tier, now",
                 "tier", "depth", "in flight", "delayed", "oldest", "running")  # fmt: skip
    for row in data["tiers"]:
        now.add_row(escape(row["tier"]), str(row["depth"]), str(row["inFlight"]),
                    str(row["delayed"]), _age(row["oldestAgeS"]), str(row["running"]))  # fmt: skip
    waiting = _table("per tenant, now", "tenant", "waiting", "oldest", "running")
    for row in data["tenants"]:
        waiting.add_row(escape(row["tenant"]), str(row["waiting"]),
                        _age(row["oldestWaitingS"]), str(row["running"]))  # fmt: skip
    for table in (now, _window_table("tier", data["tiers"], window), waiting,
                  _window_table("tenant", data["tenants"], window)):  # fmt: skip
        views.console.print(table)
    dlq = data["dlq"]
    if dlq is not None:
        views.console.print(
            f"dead letters: {dlq['depth']} waiting, {dlq['inFlight']} in flight, "
            f"oldest {_age(dlq['oldestAgeS'])}"
        )
    consumers = data["consumers"]
    slots = consumers["slots"]
    busy_workers = consumers["workers"] - consumers["idle"]
    views.console.print(
        f"workers: {consumers['workers']} running ({busy_workers} busy, {consumers['idle']} "
        f"idle), {consumers['gone']} gone; {'?' if slots is None else slots} slot(s), "
        f"{consumers['busy']} busy"
    )
    if consumers["list"]:
        workers = _table("workers", "worker", "status", "slots", "busy", "version", "seen")
        for row in consumers["list"]:
            seen = row.get("lastSeenMs") or row.get("lastHeartbeatMs")
            ago = None if seen is None else max(0, data["at"] - int(seen)) / 1000
            workers.add_row(escape(str(row["worker"])), row["status"],
                            "?" if row["slots"] is None else str(row["slots"]), str(row["busy"]),
                            escape(str(row.get("version") or "?")), _age(ago))  # fmt: skip
        views.console.print(workers)
    if data["truncated"]:
        views.console.print("[yellow]some reads were cut short: counts are lower bounds[/yellow]")


def _table(title: str, *columns: str) -> Table:
    return Table(*columns, title=title, title_justify="left")


def _window_table(key: str, rows: list[dict[str, Any]], window: str) -> Table:
    """Counts in the window (per minute in `--json`) and processing time, per tier or tenant."""
    table = _table(f"per {key}, last {window}", key, *_RATE_HEADERS.values(), "p50 ms", "p95 ms")
    for row in rows:
        table.add_row(escape(row[key]), *(str(row[name]) for name in _RATE_HEADERS), *_times(row))
    return table


def _times(row: dict[str, Any]) -> list[str]:
    times = row["processingMs"]
    return ["—" if times[p] is None else str(times[p]) for p in ("p50", "p95")]


def _age(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:g} s"
