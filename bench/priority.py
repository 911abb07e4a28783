"""Priorities under a flood: how long does urgent work wait while bulk work drains?

A flood of `low` tasks from tenant A, then `high` (tenant B) and `normal` (tenant C)
tasks arriving over the run; 2 workers x 4 slots; tasks of 0.2-1 s. Each scheduler mode
runs on fresh tier queues, and the baseline runs today's single shared queue (every
task on one queue, one tier). Wait = sent (visible at once) → the task code started
(the side log), so it includes receive, lock and child start.

Also: the longest wait of a `low` task (starvation), and the workers' AWS requests per
task, with the scheduler's `GetQueueAttributes` and receives counted apart.

    python -m bench.priority --low 60 --high 10 --normal 20   # small (default sizes: issue's)
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from agentq.envelope import TaskEnvelope
from agentq.local.aws import MotoServer
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


def plan(sizes: Sizes, side_log: Path) -> tuple[list[Planned], float]:
    """The flood, then B's and C's tasks spread over the flood's expected drain time."""
    rng = random.Random(sizes.seed)
    longest = 0.0

    def task(tier: str, tenant: str, delay: float) -> Planned:
        nonlocal longest
        seconds = round(rng.uniform(0.2, 1.0), 3)
        longest = max(longest, seconds)
        envelope = TaskEnvelope(
            request_id=f"{tier}-{rng.getrandbits(48):012x}", tenant=tenant,
            definition="bench-work", input={"seconds": seconds, "side_log": str(side_log)},
            priority=tier,
        )  # fmt: skip
        return Planned(envelope, tier, delay)

    flood = [task("low", "tenant-a", 0.0) for _ in range(sizes.low)]
    drain_s = sizes.low * 0.6 / (WORKERS * SLOTS)
    others = [("high", "tenant-b")] * sizes.high + [("normal", "tenant-c")] * sizes.normal
    rng.shuffle(others)
    arriving = [
        task(tier, tenant, 1.0 + 0.8 * drain_s * n / max(1, len(others)))
        for n, (tier, tenant) in enumerate(others)
    ]
    return flood + arriving, longest


def _send(stage: Stage, url: str, batch: Sequence[Planned]) -> None:
    for start in range(0, len(batch), 10):
        chunk = batch[start : start + 10]
        stage.sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(n), **p.envelope.send_fields()} for n, p in enumerate(chunk)],
        )  # fmt: skip


def run_mode(server: MotoServer, mode: str, sizes: Sizes, work_dir: Path) -> dict[str, Any]:
    stage = new_stage(server, prefix="p")
    side_log = work_dir / f"priority-{mode}-{time.time_ns()}.jsonl"
    tasks, longest = plan(sizes, side_log)
    tiers = stage.resources.tier_queues
    if mode == "baseline":
        # Today's agentq: one queue for everything, so one tier to the worker.
        overrides = {"SQS_QUEUE_URLS": f"normal={stage.queue_url}"}
        url_of = dict.fromkeys(tiers, stage.queue_url)
    else:
        overrides = {"SCHEDULER_MODE": mode}
        url_of = dict(tiers)
    # Leases of 15 s, not the tests' 3 s: on a loaded machine a late heartbeat would fence
    # tasks, and this benchmark measures scheduling, not heartbeats.
    env = worker_env(stage, MAX_CONCURRENT_CLAUDE=str(SLOTS),
                     VISIBILITY_EXTENSION_INTERVAL="2000", VISIBILITY_EXTENSION_AMOUNT="10",
                     **overrides)  # fmt: skip
    sent: dict[str, float] = {}
    with workers(WORKERS, env, log_dir=work_dir, name=f"{mode}-") as fleet:
        wait_started(fleet)
        flood = [p for p in tasks if p.delay_s == 0]
        began = time.time()
        for p in flood:
            sent[p.envelope.request_id] = began
        _send(stage, url_of["low"], flood)
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
        stats = stop_all(fleet)
    started: dict[str, float] = {}
    for record in read_side_log(side_log):
        if record["event"] == "start":
            started.setdefault(record["requestId"], record["t"])
    waits: dict[str, list[float]] = {"high": [], "normal": [], "low": []}
    for p in tasks:
        waits[p.tier].append(started[p.envelope.request_id] - sent[p.envelope.request_id])
    calls = merge_calls(stats)
    total = sum(calls.values())
    scheduler = [s.get("scheduler", {}) for s in stats]
    return {
        "high": _percentiles(waits["high"]),
        "normal": _percentiles(waits["normal"]),
        "low": _percentiles(waits["low"]),
        "longest_task_s": longest,
        "requests_per_task": round(total / len(tasks), 3),
        # Comparable with the seed design's 6 per task (bench/requests_per_task.py).
        "requests_per_task_without_s3": round(
            sum(n for op, n in calls.items() if not op.startswith("s3:")) / len(tasks), 3
        ),
        "attributes_per_task": round(calls.get("sqs:GetQueueAttributes", 0) / len(tasks), 3),
        "receives_per_task": round(calls.get("sqs:ReceiveMessage", 0) / len(tasks), 3),
        "forwarded": sum(int(s.get("forwarded", 0)) for s in scheduler),
        # A scheduler that asked every tier's backlog before each receive (the seed's
        # queue stats per selection) would add this many GetQueueAttributes per task.
        "per_receive_attributes_per_task": round(
            calls.get("sqs:ReceiveMessage", 0)
            * (1 if mode == "baseline" else len(tiers))
            / len(tasks),
            3,
        ),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0}
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2),
            "max": round(ordered[-1], 2)}  # fmt: skip


def run(
    server: MotoServer, *, quick: bool = False, sizes: Sizes | None = None,
    modes: Sequence[str] = MODES,
) -> dict[str, Any]:  # fmt: skip
    sizes = sizes or (Sizes.quick() if quick else Sizes())
    work_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-priority-"))
    results = {mode: run_mode(server, mode, sizes, work_dir) for mode in modes}
    return {"sizes": sizes.__dict__, "workers": WORKERS, "slots": SLOTS, "modes": results}


def table(d: Mapping[str, Any]) -> Table:
    s = d["sizes"]
    t = Table(
        title=f"priorities under a flood ({s['low']} low from A, then {s['high']} high (B) "
        f"and {s['normal']} normal (C) arriving; {d['workers']} workers x {d['slots']} slots)",
        title_justify="left",
    )
    for n, column in enumerate(("mode", "high p50/p95 s", "normal p50/p95 s", "low max s",
                                "requests/task (no S3)", "receives/task",
                                "GetQueueAttributes/task", "per-receive stats would add")):  # fmt: skip
        t.add_column(column, justify="left" if n == 0 else "right")
    for mode, r in d["modes"].items():
        t.add_row(
            mode + (" (one shared queue)" if mode == "baseline" else ""),
            f"{r['high']['p50']:.2f} / {r['high']['p95']:.2f}",
            f"{r['normal']['p50']:.2f} / {r['normal']['p95']:.2f}",
            f"{r['low']['max']:.1f}",
            f"{r['requests_per_task']:.2f} ({r.get('requests_per_task_without_s3', 0):.2f})",
            f"{r.get('receives_per_task', 0):.2f}",
            f"{r['attributes_per_task']:.3f}",
            f"{r['per_receive_attributes_per_task']:.2f}",
        )
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--low", type=int, default=Sizes.low)
    parser.add_argument("--high", type=int, default=Sizes.high)
    parser.add_argument("--normal", type=int, default=Sizes.normal)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    sizes = Sizes(low=args.low, high=args.high, normal=args.normal)
    with moto_server() as server:
        result = run(server, sizes=sizes, modes=args.modes)
    Console().print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
