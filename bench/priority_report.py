"""The priority benchmark's figures: where each run's requests went, its table, and the
issue's targets beside them (met or not)."""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.requests_per_task import seed_cost

# The worker's scheduler counters (its AGENTQ_WORKER_STATS "scheduler" entry).
SCHEDULER_COUNTS = ("receives", "emptyReceives", "watchReceives", "attributeCalls",
                    "backlogRefreshes", "forwarded")  # fmt: skip


def requests(
    *, calls: Mapping[str, int], stats: Sequence[Mapping[str, Any]], tasks: int,
    heartbeats: int, tiers: int,
) -> dict[str, Any]:  # fmt: skip
    """A run's AWS requests per task, by operation and by the scheduler's counters, and
    the seed design's cost for the same tasks and heartbeat intervals."""
    n = max(1, tasks)
    scheduler = {key: sum(int(s.get("scheduler", {}).get(key, 0)) for s in stats)
                 for key in SCHEDULER_COUNTS}  # fmt: skip
    without_s3 = sum(c for op, c in calls.items() if not op.startswith("s3:"))
    # Watched messages whose free slot filled before they came, handed to the fleet.
    passed_on = sum(int(s.get("verdicts", {}).get("passed_on", 0)) for s in stats)
    seed = seed_cost(tasks, heartbeats) / n
    return {
        "requests_per_task": round(sum(calls.values()) / n, 3),
        "requests_per_task_without_s3": round(without_s3 / n, 3),
        "calls_per_task": {op: round(c / n, 3) for op, c in calls.items()},
        "scheduler_per_task": {key: round(c / n, 3) for key, c in scheduler.items()},
        "forwarded": scheduler["forwarded"],
        "passed_on_per_task": round(passed_on / n, 3),
        "attributes_per_task": round(calls.get("sqs:GetQueueAttributes", 0) / n, 3),
        "receives_per_task": round(calls.get("sqs:ReceiveMessage", 0) / n, 3),
        "heartbeats": heartbeats,
        # The seed design on the same run: 6 per task plus 2 per task-heartbeat.
        "seed_per_task": round(seed, 3),
        "ratio_to_seed": round(without_s3 / n / seed, 3) if seed else 0.0,
        # A scheduler that asked every tier's backlog before each receive (the seed's
        # queue stats per selection) would add this many GetQueueAttributes per task.
        "per_receive_attributes_per_task": round(calls.get("sqs:ReceiveMessage", 0) * tiers / n, 3),
    }


def lock_latencies(logs: Iterable[Path]) -> dict[str, dict[str, float]]:
    """Each tier's LockLatency (ms, p50 / p95 / max) from the workers' per-tier EMF
    lines (worker.telemetry): what the lock's write cost the tasks of each tier."""
    values: dict[str, list[float]] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if '"LockLatency"' not in line or '"tier"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                values.setdefault(str(record["tier"]), []).extend(record["LockLatency"])
    return {tier: spread(found) for tier, found in values.items()}


def spread(values: Iterable[float]) -> dict[str, float]:
    """p50 (the median), p95 (the value 95 % of the way up, as the issue's waits are
    judged) and max; zeros for no values."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0}
    return {"p50": statistics.median(ordered),
            "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "max": ordered[-1]}  # fmt: skip


def checks(d: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of the issue's targets the runs cover."""
    runs: Mapping[str, Any] = d.get("modes", {})
    bound = float(d.get("starvation_bound_s", 30.0))
    out: list[tuple[str, str, bool]] = []
    for mode in ("weighted", "strict", "round-robin"):
        row = runs.get(mode)
        if row:
            limit = 2 * row["longest_task_s"]
            out.append((f"{mode}: high p95 wait ≤ 2 x longest task ({limit:.1f} s)",
                        f"{row['high']['p95']:.2f} s", row["high"]["p95"] <= limit))  # fmt: skip
    weighted, strict = runs.get("weighted"), runs.get("strict")
    idle = runs.get("idle")
    if weighted and idle:
        # On a loaded machine a child's start alone takes seconds: what the flood adds
        # over the idle system's wait is the scheduler's share.
        extra = weighted["high"]["p95"] - idle["high"]["p95"]
        limit = 2 * weighted["longest_task_s"]
        out.append((f"weighted: high p95 wait over the idle system's ≤ 2 x longest task "
                    f"({limit:.1f} s)", f"{extra:+.2f} s", extra <= limit))  # fmt: skip
    if weighted and "low_longest_gap_s" in weighted:
        gap = weighted["low_longest_gap_s"]
        out.append((f"weighted: the low tier waits ≤ the starvation bound ({bound:.0f} s) "
                    "for its turn", f"{gap:.1f} s", gap <= bound))  # fmt: skip
        low = weighted["low"]["max"]
        versus = f" (strict {strict['low']['max']:.1f} s)" if strict else ""
        out.append((f"weighted: no low task waits > the bound ({bound:.0f} s)",
                    f"{low:.1f} s{versus}", low <= bound))  # fmt: skip
    starved, guarded = runs.get("starving-strict"), runs.get("starving-weighted")
    if guarded:
        # A task received on its tier's turn still waits for a slot to free: one task.
        limit = bound + guarded["longest_task_s"]
        low = guarded["low"]["max"]
        versus = f" (strict {starved['low']['max']:.1f} s)" if starved else ""
        out.append((f"high work beyond the fleet, weighted: no low task waits > the bound "
                    f"+ one task ({limit:.0f} s)", f"{low:.1f} s{versus}", low <= limit))  # fmt: skip
    if weighted and "ratio_to_seed" in weighted:
        ratio = weighted["ratio_to_seed"]
        out.append(("weighted: requests/task ≤ 0.5 x the seed design on the same run",
                    f"{ratio:.2f} ({weighted['requests_per_task_without_s3']:.2f} / "
                    f"{weighted['seed_per_task']:.2f})", ratio <= 0.5))  # fmt: skip
    for key, label in (("weighted+limit", "with a tenant limit"),
                       ("weighted+limit-a", "with A's limit only"),
                       ("weighted", "without a tenant limit")):  # fmt: skip
        row = runs.get(key)
        if idle and row:
            for tier, tenant in (("high", "B"), ("normal", "C")):
                ref = idle[tier]["p95"]
                out.append((f"{label}: {tenant}'s p95 wait ≤ 2 x idle "
                            f"({2 * ref:.2f} s)", f"{row[tier]['p95']:.2f} s",
                            row[tier]["p95"] <= 2 * ref))  # fmt: skip
    return out


LABELS = {
    "baseline": "baseline: one shared queue",
    "weighted+limit": "weighted, tenant limit",
    "weighted+limit-a": "weighted, A's limit only",
    "idle": "idle system (B and C only)",
    "starving-strict": "high beyond the fleet: strict",
    "starving-weighted": "high beyond the fleet: weighted",
}


def table(d: Mapping[str, Any]) -> Table:
    s = d["sizes"]
    t = Table(
        title=f"priorities under a flood ({s['low']} low from A, then {s['high']} high (B) "
        f"and {s['normal']} normal (C) arriving; {d['workers']} workers x {d['slots']} slots)",
        title_justify="left",
    )
    for n, column in enumerate(("run", "high (B) p50/p95 s", "normal (C) p50/p95 s",
                                "low max s", "low turn gap s", "requests/task (no S3)",
                                "seed same run", "receives (empty) /task",
                                "GetQueueAttributes/task", "per-receive stats would add",
                                "load")):  # fmt: skip
        t.add_column(column, justify="left" if n == 0 else "right")
    for mode, r in d["modes"].items():
        sched = r.get("scheduler_per_task", {})
        t.add_row(
            LABELS.get(mode, mode),
            f"{r['high']['p50']:.2f} / {r['high']['p95']:.2f}",
            f"{r['normal']['p50']:.2f} / {r['normal']['p95']:.2f}",
            f"{r['low']['max']:.1f}",
            f"{r.get('low_longest_gap_s', 0):.1f}",
            f"{r['requests_per_task']:.2f} ({r.get('requests_per_task_without_s3', 0):.2f})",
            f"{r.get('seed_per_task', 0):.2f}",
            f"{r.get('receives_per_task', 0):.2f} ({sched.get('emptyReceives', 0):.2f})",
            f"{r['attributes_per_task']:.3f}",
            f"{r['per_receive_attributes_per_task']:.2f}",
            f"{r.get('load_at_end', 0):.1f}",
        )
    return t


def verdicts(d: Mapping[str, Any]) -> Table:
    t = Table(title="priority targets", title_justify="left")
    for column in ("target", "measured", "met"):
        t.add_column(column)
    for label, measured, met in checks(d):
        t.add_row(label, measured, "yes" if met else "[red]no[/red]")
    return t


def breakdown(d: Mapping[str, Any]) -> Table:
    """Requests per task by operation, one column per run: where they go."""
    runs: Mapping[str, Any] = d["modes"]
    ops = sorted({op for r in runs.values() for op in r.get("calls_per_task", {})})
    t = Table(title="priority runs: requests per task by operation", title_justify="left")
    t.add_column("operation")
    for mode in runs:
        t.add_column(mode, justify="right")
    for op in ops:
        t.add_row(op, *(f"{r.get('calls_per_task', {}).get(op, 0):.3f}" for r in runs.values()))
    for key in SCHEDULER_COUNTS:
        t.add_row(f"scheduler: {key}",
                  *(f"{r.get('scheduler_per_task', {}).get(key, 0):.3f}" for r in runs.values()))  # fmt: skip
    t.add_row("passed on", *(f"{r.get('passed_on_per_task', 0):.3f}" for r in runs.values()))
    for tier in ("high", "normal", "low"):
        t.add_row(f"lock ms p50 / p95: {tier}", *(_lock_cell(r, tier) for r in runs.values()))
    return t


def _lock_cell(run: Mapping[str, Any], tier: str) -> str:
    figures = run.get("lock_ms", {}).get(tier)
    return f"{figures['p50']:.0f} / {figures['p95']:.0f}" if figures else "-"
