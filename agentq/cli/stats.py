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

_RATES = ("claims", "completions", "failures", "retries", "timeouts")


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
    tiers = Table(
        "tier", "depth", "in flight", "delayed", "oldest", "running", *_RATES, "p50 ms", "p95 ms",
        title=f"agentq {data['stage']}: per tier, last {window}", title_justify="left",
    )  # fmt: skip
    for row in data["tiers"]:
        tiers.add_row(
            escape(row["tier"]), str(row["depth"]), str(row["inFlight"]), str(row["delayed"]),
            _age(row["oldestAgeS"]), str(row["running"]), *_rates(row), *_times(row),
        )  # fmt: skip
    views.console.print(tiers)
    tenants = Table(
        "tenant", "waiting", "oldest", "running", *_RATES, "p50 ms", "p95 ms",
        title=f"per tenant, last {window}", title_justify="left",
    )  # fmt: skip
    for row in data["tenants"]:
        tenants.add_row(
            escape(row["tenant"]), str(row["waiting"]), _age(row["oldestWaitingS"]),
            str(row["running"]), *_rates(row), *_times(row),
        )  # fmt: skip
    views.console.print(tenants)
    dlq = data["dlq"]
    if dlq is not None:
        views.console.print(
            f"dead letters: {dlq['depth']} waiting, {dlq['inFlight']} in flight, "
            f"oldest {_age(dlq['oldestAgeS'])}"
        )
    consumers = data["consumers"]
    slots = consumers["slots"]
    views.console.print(
        f"consumers: {consumers['workers']} worker(s) seen, "
        f"{'?' if slots is None else slots} slot(s), {consumers['busy']} busy"
    )
    if data["truncated"]:
        views.console.print("[yellow]some reads were cut short: counts are lower bounds[/yellow]")


def _rates(row: dict[str, Any]) -> list[str]:
    return [f"{row[name]} ({row['perMinute'][name]:g}/min)" for name in _RATES]


def _times(row: dict[str, Any]) -> list[str]:
    times = row["processingMs"]
    return ["—" if times[p] is None else str(times[p]) for p in ("p50", "p95")]


def _age(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:g} s"
