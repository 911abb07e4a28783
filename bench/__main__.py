"""`make bench` / `python -m bench [--quick] [--only NAME ...]`: every benchmark, one table
each, and bench/results/latest.json with every figure and the machine it ran on.

All benchmarks share one moto server on loopback; each gets a fresh stage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console

from agentq.local.aws import MotoServer
from bench import (
    chaos,
    lambda_import,
    latency,
    memory,
    priority,
    reconcile,
    report,
    requests_per_task,
    saturation,
    throughput,
)
from bench import console as console_bench
from bench.stack import moto_server

RESULTS: Final = Path(__file__).resolve().parent / "results" / "latest.json"
NAMES: Final = (
    "requests_per_task",
    "saturation",
    "latency",
    "throughput",
    "priority",
    "memory",
    "lambda_import",
    "agent",
    "console",
    "reconcile",
    "resume",
    "chaos",
)


def _chaos(quick: bool) -> dict[str, Any]:
    config = (
        chaos.ChaosConfig(tasks=60, workers=3, kill_interval_s=(2.0, 4.0), timeout_s=300)
        if quick
        else chaos.ChaosConfig(tasks=500, workers=4, timeout_s=1200)
    )
    # A server of its own: after the other benchmarks moto held ~1 GB of their state and
    # answered so slowly that the harness's 3 s leases were fenced 781 times in one run.
    with moto_server() as server:
        result = chaos.run(config, server=server)
    return {
        "config": {"tasks": config.tasks, "workers": config.workers, "slots": config.slots},
        "summary": result.summary(),
        "violations": result.violations,
        "findings": result.findings,
    }


def _agent(quick: bool) -> dict[str, Any]:
    try:
        from bench import bench_agent
    except ImportError as exc:
        return {"skipped": f"bench.bench_agent not importable: {exc}"}
    # bench_agent prints its own table; keep it for the log, show ours.
    with contextlib.redirect_stdout(io.StringIO()):
        figures: dict[str, Any] = bench_agent.run(runs=1 if quick else 3)
    return figures


def _resume(server: MotoServer, quick: bool) -> dict[str, Any]:
    from bench import resume

    config = resume.Config(tasks=2, turns=8) if quick else resume.Config()
    figures = resume.run(config, server=server)
    resume.RESULTS.write_text(json.dumps(figures, indent=1) + "\n")
    figures.pop("runs")  # the raw records stay in bench/results/resume.json
    return figures


def run_all(names: tuple[str, ...], quick: bool, console: Console) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with moto_server() as server:
        steps: dict[str, Callable[[], dict[str, Any]]] = {
            "requests_per_task": lambda: requests_per_task.run(server, quick=quick),
            "saturation": lambda: saturation.run(server, quick=quick),
            "latency": lambda: latency.run(server, quick=quick),
            "throughput": lambda: throughput.run(server, quick=quick),
            "priority": lambda: priority.run(server, quick=quick),
            "memory": lambda: memory.run(server, quick=quick),
            "lambda_import": lambda: lambda_import.run(quick=quick),
            "agent": lambda: _agent(quick),
            "console": lambda: console_bench.run(server, quick=quick),
            "resume": lambda: _resume(server, quick),
            # moto in-process; at full size moto takes minutes a run (its index query
            # sorts the table), so two runs give the cost, --quick the reach.
            "reconcile": lambda: (
                reconcile.run(tasks=2_000, page=100)
                if quick
                else reconcile.run(tasks=reconcile.DEFAULT_TASKS, max_runs=2)
            ),
            "chaos": lambda: _chaos(quick),
        }
        for name in names:
            began = time.monotonic()
            console.log(f"running {name} ...")
            try:
                results[name] = steps[name]()
            except Exception as exc:
                results[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
                console.log(traceback.format_exc(limit=3))
            results[name]["seconds"] = round(time.monotonic() - began, 1)
            console.print(report.table(name, results[name]))
    if "memory" in results and "agent" in results and "skipped" not in results["agent"]:
        results["memory"]["agent_child_mb"] = results["agent"].get("child_with_cli_peak_rss_mb")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="run just these")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    # A SIGTERM unwinds through every cleanup (workers, moto) instead of orphaning them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console()
    began = time.monotonic()
    results = run_all(tuple(args.only or NAMES), args.quick, console)
    document = {
        "command": "python -m bench"
        + (" --quick" if args.quick else "")
        + (f" --only {' '.join(args.only)}" if args.only else ""),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - began, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=1, default=str) + "\n")
    console.print(report.verdicts(results))
    console.print(f"wrote {args.output} in {document['seconds']} s")
    violations = results.get("chaos", {}).get("violations") or []
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
