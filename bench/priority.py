"""Priorities under a flood: how long does urgent work wait while bulk work drains?

A flood of `low` tasks from tenant A, then `high` (tenant B) and `normal` (tenant C)
tasks arriving over the run; 2 workers x 4 slots; tasks of 0.2-1 s. Each scheduler mode
runs on fresh tier queues, and the baseline runs today's single shared queue (every
task on one queue, one tier). Wait = sent (visible at once) → the task code started
(the side log), so it includes receive, lock and child start.

Also: the longest wait of a `low` task (starvation), and the workers' AWS requests per
task, with the scheduler's `GetQueueAttributes` and receives counted apart.

    python -m bench.priority                  # the issue's sizes, every run
    python -m bench.priority --low 60 --high 10 --normal 20 --runs weighted idle

The starving runs (`--runs starving-strict starving-weighted`) send more `high` work than
the fleet runs, for 45 s, and a few `low` tasks meanwhile: how long a low task waits in
`strict` mode (until the high tier drains) against `weighted` (its tier's turn comes
within the starvation bound).

Also B's and C's waits with a tenant limit (`TENANT_CONCURRENCY_LIMIT`) and on an idle
system (no flood), the reference of the tenant target. The figures go to
bench/results/priority.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

from rich.console import Console

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.local.aws import MotoServer
from agentq.store.tenants import TenantLimitStore
from bench.priority_report import (
    breakdown,
    lock_latencies,
    requests,
    spread,
    table,
    verdicts,
)
from bench.stack import (
    Stage,
    merge_calls,
    moto_server,
    new_stage,
    read_side_log,
    stop_all,
    wait_side_log_ends,
    wait_started,
    worker_env,
    workers,
)

WORKERS: Final = 2
SLOTS: Final = 4
MODES: Final = ("baseline", "strict", "weighted", "round-robin")
RESULTS: Final = Path(__file__).resolve().parent / "results" / "priority.json"


@dataclass(frozen=True)
class Sizes:
    low: int = 500
    high: int = 50
    normal: int = 100
    seed: int = 7

    @classmethod
    def quick(cls) -> Sizes:
        return cls(low=60, high=10, normal=20)


@dataclass(frozen=True)
class Planned:
    envelope: TaskEnvelope
    tier: str
    delay_s: float  # when it is sent, after the flood


class _Planner:
    """Tasks of 0.2-1 s (the side log records their starts), from one seeded generator."""

    def __init__(self, seed: int, side_log: Path) -> None:
        self.rng = random.Random(seed)
        self.side_log = side_log
        self.longest = 0.0

    def task(self, tier: str, tenant: str, delay: float) -> Planned:
        seconds = round(self.rng.uniform(0.2, 1.0), 3)
        self.longest = max(self.longest, seconds)
        envelope = TaskEnvelope(
            request_id=f"{tier}-{self.rng.getrandbits(48):012x}", tenant=tenant,
            definition="bench-work", input={"seconds": seconds, "side_log": str(self.side_log)},
            priority=tier,
        )  # fmt: skip
        return Planned(envelope, tier, delay)


def plan(sizes: Sizes, side_log: Path) -> tuple[list[Planned], float]:
    """The flood, then B's and C's tasks spread over the flood's expected drain time."""
    planner = _Planner(sizes.seed, side_log)
    flood = [planner.task("low", "tenant-a", 0.0) for _ in range(sizes.low)]
    drain_s = sizes.low * 0.6 / (WORKERS * SLOTS)
    others = [("high", "tenant-b")] * sizes.high + [("normal", "tenant-c")] * sizes.normal
    planner.rng.shuffle(others)
    arriving = [
        planner.task(tier, tenant, 1.0 + 0.8 * drain_s * n / max(1, len(others)))
        for n, (tier, tenant) in enumerate(others)
    ]
    return flood + arriving, planner.longest


@dataclass(frozen=True)
class Starving:
    """More urgent work than the fleet can run, and a few low tasks meanwhile.

    `high_rate` high tasks a second (B) for `high_s` seconds: the fleet starts 8 to 13 a
    second on a 2-core VM, so the high tier is never empty while they arrive and for a
    while after. `low` tasks (A) arrive evenly over the same time. In `strict` mode each
    low task waits until the high tier drains; `weighted` mode gives their tier a turn
    within the bound."""

    high_rate: float = 18.0
    high_s: float = 45.0
    low: int = 9
    seed: int = 11

    @classmethod
    def quick(cls) -> Starving:
        return cls(high_rate=18.0, high_s=12.0, low=4)


def plan_starving(sizes: Starving, side_log: Path) -> tuple[list[Planned], float]:
    planner = _Planner(sizes.seed, side_log)
    count = round(sizes.high_rate * sizes.high_s)
    urgent = [planner.task("high", "tenant-b", 0.5 + n / sizes.high_rate) for n in range(count)]
    # Spread over the stream, never at its first moment: each is sent while high work waits.
    low = [planner.task("low", "tenant-a", sizes.high_s * (n + 0.5) / sizes.low)
           for n in range(sizes.low)]  # fmt: skip
    return sorted([*urgent, *low], key=lambda p: p.delay_s), planner.longest


def _send(stage: Stage, url: str, batch: Sequence[Planned]) -> None:
    for start in range(0, len(batch), 10):
        chunk = batch[start : start + 10]
        stage.sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(n), **p.envelope.send_fields()} for n, p in enumerate(chunk)],
        )  # fmt: skip


def run_mode(
    server: MotoServer, mode: str, sizes: Sizes, work_dir: Path, *, label: str | None = None,
    flood: bool = True, extra_env: Mapping[str, str] | None = None,
    tenant_limits: Mapping[str, int] | None = None,
    planner: Callable[[Path], tuple[list[Planned], float]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run: `mode` is a scheduler mode or "baseline" (one shared queue); without the
    flood only B's and C's tasks arrive (the idle-system reference). `tenant_limits`:
    per-tenant overrides, stored as `agentq tenants limit` stores them. `planner`: the
    run's tasks instead of `plan(sizes)` (the starving runs)."""
    stage = new_stage(server, prefix="p")
    beats_url = stage.tap("Task Heartbeat")
    limits = TenantLimitStore(stage.clients["dynamodb"], stage.resources.table_name)
    for tenant, limit in (tenant_limits or {}).items():
        limits.set(tenant, limit)
    side_log = work_dir / f"priority-{label or mode}-{time.time_ns()}.jsonl"
    tasks, longest = planner(side_log) if planner else plan(sizes, side_log)
    if not flood:
        tasks = [p for p in tasks if p.delay_s > 0]
    tiers = stage.resources.tier_queues
    if mode == "baseline":
        # Today's agentq: one queue for everything, so one tier to the worker.
        overrides = {"SQS_QUEUE_URLS": f"normal={stage.queue_url}"}
        url_of = dict.fromkeys(tiers, stage.queue_url)
    else:
        overrides = {"SCHEDULER_MODE": mode}
        url_of = dict(tiers)
    # Leases of 15 s, not the tests' 3 s: on a loaded machine a late heartbeat would fence
    # tasks, and this benchmark measures scheduling, not heartbeats. Long polls of 20 s,
    # as deployed: the requests an idle tier costs are a production figure, not a test's.
    env = worker_env(stage, MAX_CONCURRENT_CLAUDE=str(SLOTS), WAIT_TIME_SECONDS="20",
                     VISIBILITY_EXTENSION_INTERVAL="2000", VISIBILITY_EXTENSION_AMOUNT="10",
                     **overrides, **(extra_env or {}))  # fmt: skip
    sent: dict[str, float] = {}
    with workers(WORKERS, env, log_dir=work_dir, name=f"{label or mode}-") as fleet:
        wait_started(fleet)
        first = [p for p in tasks if p.delay_s == 0]
        began = time.time()
        for p in first:
            sent[p.envelope.request_id] = began
        _send(stage, url_of["low"], first)
        later = sorted((p for p in tasks if p.delay_s > 0), key=lambda p: p.delay_s)

        def feed() -> None:
            for p in later:
                time.sleep(max(0.0, began + p.delay_s - time.time()))
                sent[p.envelope.request_id] = time.time()
                _send(stage, url_of[p.tier], [p])

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        wait_side_log_ends(side_log, len(tasks), timeout_s=120 + sum(
            float(p.envelope.input["seconds"]) for p in tasks))  # fmt: skip
        feeder.join()
        load = os.getloadavg()[0]
        stats = stop_all(fleet)
        locks = lock_latencies(w.log_path for w in fleet)
    started: dict[str, float] = {}
    for record in read_side_log(side_log):
        if record["event"] == "start":
            started.setdefault(record["requestId"], record["t"])
    waits: dict[str, list[float]] = {"high": [], "normal": [], "low": []}
    for p in tasks:
        waits[p.tier].append(started[p.envelope.request_id] - sent[p.envelope.request_id])
    low_starts = sorted(started[p.envelope.request_id] for p in tasks if p.tier == "low")
    heartbeats = sum(stage.queue_counts(beats_url))
    return {
        "high": _percentiles(waits["high"]),
        "normal": _percentiles(waits["normal"]),
        "low": _percentiles(waits["low"]),
        # The starvation bound is about a tier's turn: the longest the flood's tier went
        # without a task starting while it still had work (its first to its last start).
        "low_longest_gap_s": round(max((b - a for a, b in pairwise(low_starts)), default=0.0), 2),
        "longest_task_s": longest,
        "tasks": len(tasks),
        "load_at_end": round(load, 1),
        "env": dict(extra_env or {}),
        "tenant_limits": dict(tenant_limits or {}),
        "lock_ms": locks,
        **requests(calls=merge_calls(stats), stats=stats, tasks=len(tasks),
                   heartbeats=heartbeats, tiers=1 if mode == "baseline" else len(tiers)),
    }  # fmt: skip


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return spread(values)
    # The slowest few decide p95 (the 3rd slowest of 50): kept to show how it was reached.
    return {**{key: round(v, 2) for key, v in spread(values).items()},
            "slowest": [round(v, 3) for v in sorted(values)[-8:]]}  # fmt: skip


# Every run of the full benchmark, in one go: the modes beside the one-queue baseline,
# weighted with a tenant limit, and the idle-system reference for B's and C's waits.
# Most telling first: a run cut short by a slow machine still has the baseline, the
# target's mode and its references (the figures are written after every run).
RUNS: Final = ("baseline", "weighted", "idle", "weighted+limit", "weighted+limit-a", "strict",
               "round-robin", "starving-strict", "starving-weighted")  # fmt: skip
# A tenant's share of the fleet's 8 slots: A's flood may hold half, B and C the rest.
TENANT_LIMIT: Final = 4


def run(
    server: MotoServer, *, quick: bool = False, sizes: Sizes | None = None,
    modes: Sequence[str] = RUNS, on_run: Callable[[dict[str, Any]], None] | None = None,
    tenant_limit: int = TENANT_LIMIT,
) -> dict[str, Any]:  # fmt: skip
    sizes = sizes or (Sizes.quick() if quick else Sizes())
    work_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-priority-"))
    results: dict[str, Any] = {}
    figures = {"sizes": sizes.__dict__, "workers": WORKERS, "slots": SLOTS,
               "starvation_bound_s": Settings().starvation_bound_ms / 1000,
               "tenant_limit": tenant_limit, "modes": results}  # fmt: skip
    for name in modes:
        if name == "weighted+limit":
            # TENANT_CONCURRENCY_LIMIT: the fleet-wide per-tenant limit (docs/scheduling.md).
            results[name] = run_mode(server, "weighted", sizes, work_dir, label="limit",
                                     extra_env={"TENANT_CONCURRENCY_LIMIT": str(tenant_limit)})  # fmt: skip
        elif name == "weighted+limit-a":
            # Only the flooding tenant limited, by an override in DynamoDB: what an
            # operator does about one noisy tenant (`agentq tenants limit tenant-a 4`).
            results[name] = run_mode(server, "weighted", sizes, work_dir, label="limit-a",
                                     tenant_limits={"tenant-a": tenant_limit})  # fmt: skip
        elif name.startswith("starving-"):
            # Per task, the bound holds only where the low tier's arrivals fit its turns:
            # shown under more urgent work than the fleet runs, against strict mode.
            starving = Starving.quick() if quick else Starving()
            mode = name.removeprefix("starving-")
            results[name] = run_mode(server, mode, sizes, work_dir, label=name,
                                     planner=partial(plan_starving, starving))  # fmt: skip
        elif name == "idle":
            results[name] = run_mode(server, "weighted", sizes, work_dir, label="idle",
                                     flood=False)  # fmt: skip
        else:
            results[name] = run_mode(server, name, sizes, work_dir)
        if on_run is not None:
            on_run(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--low", type=int, default=Sizes.low)
    parser.add_argument("--high", type=int, default=Sizes.high)
    parser.add_argument("--normal", type=int, default=Sizes.normal)
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    parser.add_argument(
        "--tenant-limit",
        type=int,
        default=TENANT_LIMIT,
        help="the limit of the tenant-limit runs (of the fleet's 8 slots)",
    )
    args = parser.parse_args(argv)
    sizes = Sizes(low=args.low, high=args.high, normal=args.normal)
    began = os.getloadavg()

    def write(result: dict[str, Any]) -> None:
        result["machine"] = {"cpus": os.cpu_count(), "load_before": [round(x, 1) for x in began],
                             "load_after": [round(x, 1) for x in os.getloadavg()],
                             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    with moto_server() as server:
        result = run(
            server, sizes=sizes, modes=args.runs, on_run=write, tenant_limit=args.tenant_limit
        )
    console = Console()
    console.print(table(result))
    console.print(breakdown(result))
    console.print(verdicts(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
