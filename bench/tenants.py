"""Tenants on one tier: does a limited tenant's flood delay the others?

Every tenant's work on the one task queue (one tier), as a user runs agentq by
default: tenant A floods `flood` tasks of 0.5 s at once and is limited fleet-wide
(`agentq tenants limit tenant-a 2`); B and C send `each` tasks apiece, one by one over
the flood. 2 workers x 4 slots. Wait = sent → the task code started (the side log).

Three runs: `idle` (B and C alone: the reference), `fair` (the flood, on the local
stack's SQS fair queues, agentq.local.rules.fair_queues) and `unfair` (the flood on a
moto server started with AGENTQ_LOCAL_FAIR_QUEUES=0: a queue without fair queues, as an
EventBridge-submitted task or a foreign sender's message meets one). The target: B's and
C's p95 wait ≤ 2 x idle + 0.5 s with fair queues.

    python -m bench.tenants                 # 150 of A, 8 each of B and C
    python -m bench.tenants --flood 60 --each 6 --runs idle fair
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from agentq.envelope import TaskEnvelope
from agentq.local.aws import MotoServer
from agentq.local.rules.fair_queues import SWITCH
from bench.priority import Planned, run_mode
from bench.priority import Sizes as PrioritySizes

RUNS: Final = ("idle", "fair", "unfair")
RESULTS: Final = Path(__file__).resolve().parent / "results" / "tenants.json"
TASK_S: Final = 0.5


@dataclass(frozen=True)
class Sizes:
    flood: int = 150
    each: int = 8
    limit: int = 2
    seed: int = 5


def plan(sizes: Sizes, side_log: Path) -> tuple[list[Planned], float]:
    """A's flood at once, then B's and C's tasks (labelled `high` and `normal` for the
    report; all go to the one queue) spread over the first half of the flood's drain."""
    rng = random.Random(sizes.seed)

    def task(tenant: str, label: str, delay: float) -> Planned:
        envelope = TaskEnvelope(
            request_id=f"{tenant}-{rng.getrandbits(48):012x}", tenant=tenant,
            definition="bench-work", input={"seconds": TASK_S, "side_log": str(side_log)},
        )  # fmt: skip
        return Planned(envelope, label, delay)

    flood = [task("tenant-a", "low", 0.0) for _ in range(sizes.flood)]
    spread_s = sizes.flood * TASK_S / sizes.limit / 2
    others = [("tenant-b", "high"), ("tenant-c", "normal")] * sizes.each
    arriving = [
        task(tenant, label, 1.0 + spread_s * n / len(others))
        for n, (tenant, label) in enumerate(others)
    ]
    return flood + arriving, TASK_S


@contextlib.contextmanager
def _server(*, fair: bool) -> Iterator[MotoServer]:
    """A moto server whose fair-queue rule is on or off (read in its own environment)."""
    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "1" if fair else "0"
    try:
        with MotoServer() as server:
            yield server
    finally:
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before


def run(sizes: Sizes, runs: Sequence[str]) -> dict[str, Any]:
    work_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-tenants-"))
    results: dict[str, Any] = {}
    for name in runs:
        with _server(fair=name != "unfair") as server:
            results[name] = run_mode(
                server, "baseline", PrioritySizes(), work_dir, label=name, flood=name != "idle",
                tenant_limits={"tenant-a": sizes.limit}, planner=partial(plan, sizes),
            )  # fmt: skip
    return {"sizes": sizes.__dict__, "runs": results}


def table(figures: dict[str, Any]) -> Table:
    runs = figures["runs"]
    idle = runs.get("idle")
    out = Table(title="tenants on one tier: B's / C's wait (s), A limited to "
                f"{figures['sizes']['limit']}")  # fmt: skip
    for column in ("run", "B p50 / p95", "C p50 / p95", "target (2 x idle + 0.5)", "met",
                   "A p95", "requests / task"):  # fmt: skip
        out.add_column(column)
    for name, run_ in runs.items():
        b, c = run_["high"], run_["normal"]
        target = met = "-"
        if idle is not None and name != "idle":
            bound_b = 2 * idle["high"]["p95"] + 0.5
            bound_c = 2 * idle["normal"]["p95"] + 0.5
            target = f"{bound_b:.2f} / {bound_c:.2f}"
            met = "yes" if b["p95"] <= bound_b and c["p95"] <= bound_c else "no"
        out.add_row(name, f"{b['p50']:.2f} / {b['p95']:.2f}", f"{c['p50']:.2f} / {c['p95']:.2f}",
                    target, met, f"{run_['low'].get('p95', 0):.2f}",
                    f"{run_['requests_per_task']:.2f}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood", type=int, default=Sizes.flood)
    parser.add_argument("--each", type=int, default=Sizes.each)
    parser.add_argument("--limit", type=int, default=Sizes.limit)
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    began = os.getloadavg()
    figures = run(Sizes(flood=args.flood, each=args.each, limit=args.limit), args.runs)
    figures["machine"] = {"cpus": os.cpu_count(), "load_before": [round(x, 1) for x in began],
                          "load_after": [round(x, 1) for x in os.getloadavg()],
                          "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    Console().print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
