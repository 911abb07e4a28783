"""`agentq cost estimate`: a month of agentq in dollars, AWS and model side by side."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from agentq.cli import _views as views
from agentq.cli.common import EXIT_OK, emit_json


def register(subparsers: Any) -> None:
    from agentq.config.light import DEFAULT_MODEL
    from agentq.cost import MODEL_PRICES, STAGES

    cost = subparsers.add_parser("cost", help="what agentq costs (docs/cost.md)")
    commands = cost.add_subparsers(dest="cost_command", metavar="COMMAND", required=True)
    est = commands.add_parser("estimate", help="a month's cost for a task volume")
    est.add_argument("--tasks", type=float, default=10_000, help="tasks per month (10000)")
    est.add_argument("--task-seconds", type=float, default=120, help="seconds per task (120)")
    est.add_argument("--input-tokens", type=float, default=20_000, help="per task (20000)")
    est.add_argument("--output-tokens", type=float, default=2_000, help="per task (2000)")
    est.add_argument("--stage", choices=sorted(STAGES), default="prod")
    est.add_argument(
        "--model",
        choices=sorted(MODEL_PRICES),
        default=DEFAULT_MODEL,
        help=f"the model of agent tasks ({DEFAULT_MODEL}, as CLAUDE_MODEL)",
    )
    est.add_argument("--python", action="store_true", help="python tasks: no model cost")
    views.add_json_flag(est)
    est.set_defaults(func=_estimate)


def _estimate(args: argparse.Namespace) -> int:
    from agentq.cost import PRICE_REGION, PRICES_AS_OF, estimate

    if args.tasks < 0 or args.task_seconds < 0:
        from agentq.errors import InvalidInput

        raise InvalidInput("--tasks/--task-seconds", "must not be negative")
    result = estimate(
        tasks=args.tasks, task_seconds=args.task_seconds, stage=args.stage, model=args.model,
        input_tokens=args.input_tokens, output_tokens=args.output_tokens, agent=not args.python,
    )  # fmt: skip
    per_thousand = {
        design: round(sum(parts.values()) * 1000 / args.tasks, 4) if args.tasks else 0.0
        for design, parts in result.aws_per_task_design.items()
    }
    data = {
        "prices": f"{PRICE_REGION} list prices as of {PRICES_AS_OF}",
        "tasks_per_month": args.tasks,
        "stage": args.stage,
        "model": None if args.python else args.model,
        "aws_requests_usd": {
            d: round(sum(p.values()), 4) for d, p in result.aws_per_task_design.items()
        },
        "aws_requests_per_1000_tasks_usd": per_thousand,
        "aws_requests_by_service_usd": {
            k: round(v, 4) for k, v in result.aws_per_task_design["agentq"].items()
        },
        "worker_compute_usd": round(result.compute, 2),
        "fixed_monthly_usd": {k: round(v, 2) for k, v in result.fixed.items()},
        "model_usd": round(result.model_usd, 2),
        "total_usd": round(result.total, 2),
    }
    if args.json:
        emit_json(data)
        return EXIT_OK
    table = Table("part", "per month", title=f"agentq {args.stage}: {args.tasks:,.0f} tasks of "
                  f"{args.task_seconds:g} s a month ({data['prices']})", title_justify="left")  # fmt: skip
    for name, value in result.aws_per_task_design["agentq"].items():
        table.add_row(f"AWS requests: {name}", views.money(value))
    table.add_row("worker compute (Fargate, beyond always-on)", views.money(result.compute))
    for name, value in result.fixed.items():
        table.add_row(f"fixed: {name}", views.money(value))
    if not args.python:
        table.add_row(f"model: {args.model}", views.money(result.model_usd))
    table.add_row("[bold]total[/bold]", f"[bold]{views.money(result.total)}[/bold]")
    views.console.print(table)
    compare = Table("design", "AWS requests per 1,000 tasks", title="the same tasks, other designs",
                    title_justify="left")  # fmt: skip
    for design, value in per_thousand.items():
        compare.add_row(design, views.money(value))
    views.console.print(compare)
    return EXIT_OK
