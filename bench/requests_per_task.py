"""AWS requests per task, by operation, from the worker's own call counter.

Two runs against one worker (10 slots): many no-op tasks that finish before any
heartbeat, and a few long tasks that keep 10 in flight through many heartbeats. The
heartbeat count of each run is the number of `Task Heartbeat` events (one per task per
interval). Per operation, calls = tasks x per_task + heartbeats x per_heartbeat; two runs
give two equations, solved for both costs. What the long run does besides beating
lands in the solved per-heartbeat column too: the tenant-limit cache's reads (one per
tenant per 30 s) and the watchers' idle long polls grow with the run's length.

The heartbeat's own cost is therefore measured directly, in the long run, whose ten
tasks are held together by the ten slots: the calls the heartbeat thread made (the
visibility batch and the lease transaction) per `Task Heartbeat` event, plus the
`PutEvents` calls per event published (heartbeat events share the worker's event
batches). A worker holding more than ten (prefetched messages are locked and beat too)
pays a second visibility batch; the figure is for ten.

The seed design's cost, as a formula with the same inputs: per task one receive (one
message per call), a GSI query and a conditional put for the lock, one `PutEvents` per
event, one delete; per task per heartbeat one `ChangeMessageVisibility` and one
`PutEvents`. Artifact uploads (S3) are the same in both designs and shown apart.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.local.aws import MotoServer
from bench.stack import (
    envelope,
    merge_calls,
    new_stage,
    stop_all,
    wait_started,
    worker_env,
    workers,
)

EVENTS_PER_TASK: Final = (
    2  # Task Processing Started, Task Completed (the producer's are not counted)
)


def seed_cost(tasks: int, heartbeats: int, *, events_per_task: int = EVENTS_PER_TASK) -> int:
    """Requests the seed design spends on `tasks` tasks and `heartbeats` task-intervals."""
    per_task = 1 + 2 + events_per_task + 1  # receive, GSI query + put, PutEvents each, delete
    return tasks * per_task + heartbeats * 2  # ChangeMessageVisibility + PutEvents


@dataclass(frozen=True, kw_only=True)
class Run:
    tasks: int
    heartbeats: int
    calls: dict[str, int]
    # The priority scheduler's own counters (receives, empty ones, watchers' long polls,
    # backlog refreshes): where the receives of `calls` went.
    scheduler: dict[str, int]
    beats: int  # heartbeat intervals that had messages to keep
    heartbeat_calls: dict[str, int]  # the calls the heartbeat thread made


def _run(
    server: MotoServer, *, tasks: int, definition: str, payload: dict[str, Any], env: dict[str, str]
) -> Run:
    stage = new_stage(server, prefix="r")
    beats_url = stage.tap("Task Heartbeat")
    stage.send([envelope(definition, payload) for _ in range(tasks)])
    log_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-rpt-"))
    with workers(1, worker_env(stage, **env), log_dir=log_dir) as fleet:
        wait_started(fleet)
        stage.wait_drained(timeout_s=60 + tasks * 2)
        stats = stop_all(fleet)
    if not stats:
        raise RuntimeError(f"the worker printed no stats:\n{fleet[0].output()[-2000:]}")
    scheduler: dict[str, int] = {}
    for entry in stats:
        for key, n in entry.get("scheduler", {}).items():
            if isinstance(n, int):
                scheduler[key] = scheduler.get(key, 0) + n
    return Run(tasks=tasks, heartbeats=sum(stage.queue_counts(beats_url)), calls=merge_calls(stats),
               scheduler=scheduler, beats=sum(int(e.get("heartbeats", 0)) for e in stats),
               heartbeat_calls=merge_calls(stats, "heartbeatCalls"))  # fmt: skip


def heartbeat_cost(run: Run) -> dict[str, Any]:
    """What one interval costs a held task: the heartbeat thread's calls per `Task
    Heartbeat` event (one per leased message per beat), plus one event's share of a
    `PutEvents` call (see the module doc)."""
    events = EVENTS_PER_TASK * run.tasks + run.heartbeats
    per_event = run.calls.get("events:PutEvents", 0) / events if events else 0.0
    if not run.beats or not run.heartbeats:
        return {"beats": run.beats, "put_events_per_event": round(per_event, 3)}
    return {
        "beats": run.beats,
        "held_per_beat": round(run.heartbeats / run.beats, 2),
        "calls_per_beat": {op: round(n / run.beats, 3) for op, n in run.heartbeat_calls.items()},
        "put_events_per_event": round(per_event, 3),
        "per_task_interval": round(
            sum(run.heartbeat_calls.values()) / run.heartbeats + per_event, 3
        ),
    }


def _solve(a: Run, b: Run, op: str) -> tuple[float, float]:
    """(per task, per heartbeat) calls of `op` from the two runs (Cramer's rule)."""
    ca, cb = a.calls.get(op, 0), b.calls.get(op, 0)
    det = a.tasks * b.heartbeats - b.tasks * a.heartbeats
    if det == 0:
        return ca / a.tasks, 0.0
    per_task = (ca * b.heartbeats - cb * a.heartbeats) / det
    per_beat = (a.tasks * cb - b.tasks * ca) / det
    return max(0.0, per_task), max(0.0, per_beat)


def run(
    server: MotoServer,
    *,
    quick: bool = False,
    tasks: int | None = None,
    long: tuple[int, float] | None = None,
) -> dict[str, Any]:
    tasks = tasks or (40 if quick else 200)
    # Ten in flight: the long tasks fill the ten slots, with none left to prefetch.
    long_tasks, long_seconds = long or ((10, 2.0) if quick else (10, 6.0))
    common = {"MAX_CONCURRENT_CLAUDE": "10", "WAIT_TIME_SECONDS": "2"}
    # No heartbeat fires during a no-op task: the per-task cost alone.
    short = _run(server, tasks=tasks, definition="bench-noop", payload={},
                 env={**common, "VISIBILITY_EXTENSION_INTERVAL": "20000",
                      "VISIBILITY_EXTENSION_AMOUNT": "30"})  # fmt: skip
    # Ten long tasks in flight, heartbeats every 300 ms. The lease (1.5 x 4 s) leaves room
    # for a late renewal. With 3 s, a run at load 5 measured 0.31 instead of 0.24, the
    # difference all `UpdateItem`: fenced attempts settled by token and run again.
    slow = _run(server, tasks=long_tasks, definition="bench-work",
                payload={"seconds": long_seconds},
                env={**common, "VISIBILITY_EXTENSION_INTERVAL": "300",
                     "VISIBILITY_EXTENSION_AMOUNT": "4"})  # fmt: skip
    operations = sorted(set(short.calls) | set(slow.calls))
    rows: list[dict[str, Any]] = []
    per_task_total = per_beat_total = per_task_s3 = 0.0
    for op in operations:
        per_task, per_beat = _solve(short, slow, op)
        rows.append({"operation": op, "per_task": round(per_task, 3),
                     "per_heartbeat": round(per_beat, 3)})  # fmt: skip
        per_task_total += per_task
        per_beat_total += per_beat
        if op.startswith("s3:"):
            per_task_s3 += per_task
    heartbeat = heartbeat_cost(slow)
    seed_per_task = seed_cost(1, 0)
    seed_per_beat = seed_cost(0, 1)
    comparable = per_task_total - per_task_s3
    return {
        "tasks": short.tasks,
        "concurrency": 10,
        "runs": {
            "no-op": {"tasks": short.tasks, "heartbeats": short.heartbeats, "calls": short.calls},
            "long": {
                "tasks": slow.tasks,
                "heartbeats": slow.heartbeats,
                "calls": slow.calls,
                "seconds_each": long_seconds,
            },
        },
        "operations": rows,
        # Every tier is configured (the local stack's three queues), so the scheduler is on.
        "scheduler_per_task": {k: round(n / short.tasks, 3) for k, n in short.scheduler.items()},
        "per_task": round(per_task_total, 3),
        "per_task_without_s3": round(comparable, 3),
        "per_heartbeat": round(per_beat_total, 3),
        "heartbeat": heartbeat,
        "seed_per_task": seed_per_task,
        "seed_per_heartbeat": seed_per_beat,
        "seed_total_for_run": seed_cost(short.tasks, short.heartbeats),
        "agentq_total_for_run": sum(short.calls.values()),
        "ratio_per_task": round(comparable / seed_per_task, 3),
        "ratio_per_heartbeat": round(per_beat_total / seed_per_beat, 3),
        "targets": {"ratio_per_task": "<= 0.5", "per_heartbeat": "<= 0.3"},
    }
