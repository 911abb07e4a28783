"""Slot saturation: does a worker keep every slot busy?

N tasks of 0.5 s, 4 slots, 1 worker. The makespan runs from the first child's spawn to
the last task's end (side log). Two ideals: declared work (N x 0.5 s / slots) and
measured work (the sum of the children's lifetimes, spawn to end, / slots); the second
ratio isolates dispatch (a child's interpreter start-up is work the slot really does).

The baseline is the naive loop: receive up to 4, run them, wait for all 4, delete,
repeat; it runs the same child (`python -m worker.child`) and the same task code, with
no lock and no events. A variant with uneven durations (0.1-0.9 s, same mean) shows
what waiting for a whole batch costs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentq.definitions import load_file
from agentq.local.aws import MotoServer
from agentq.local.workers import REPO_ROOT
from bench.stack import (
    BENCH_DEFINITIONS,
    envelope,
    new_stage,
    read_side_log,
    stop_all,
    wait_side_log_ends,
    wait_started,
    worker_env,
    workers,
)
from worker.child.env import child_environment

SLOTS = 4


def _durations(tasks: int, uneven: bool, rng: random.Random) -> list[float]:
    if uneven:
        return [rng.uniform(0.1, 0.9) for _ in range(tasks)]
    return [0.5] * tasks


def _measure(side_log: Path, declared: Sequence[float]) -> dict[str, float]:
    lines = read_side_log(side_log)
    starts = {(r["requestId"], r["pid"]): r for r in lines if r["event"] == "start"}
    ends = [r for r in lines if r["event"] == "end"]
    finished = {r["requestId"] for r in ends if r.get("outcome") == "ok"}
    if len(finished) != len(declared):
        raise RuntimeError(f"{len(finished)} of {len(declared)} tasks ended ok")
    first = min(r["spawned"] for r in starts.values())
    last = max(r["t"] for r in ends)
    lifetimes = [r["t"] - starts[(r["requestId"], r["pid"])]["spawned"] for r in ends]
    makespan = last - first
    ideal_declared = sum(declared) / SLOTS
    ideal_measured = sum(lifetimes) / SLOTS
    return {
        "makespan_s": round(makespan, 3),
        "ideal_declared_s": round(ideal_declared, 3),
        "ideal_measured_s": round(ideal_measured, 3),
        "ratio": round(makespan / ideal_measured, 3),
        "ratio_declared": round(makespan / ideal_declared, 3),
        "child_overhead_s": round((sum(lifetimes) - sum(declared)) / len(declared), 3),
        # Executions beyond one per task (a stopped attempt run again); their lifetimes
        # count as work the slots did.
        "re_executions": len(ends) - len(declared),
    }


def agentq_run(server: MotoServer, durations: Sequence[float], work_dir: Path) -> dict[str, float]:
    stage = new_stage(server, prefix="s")
    side_log = work_dir / f"agentq-{len(durations)}-{time.time_ns()}.jsonl"
    stage.send([envelope("bench-work", {"seconds": d, "side_log": str(side_log)})
                for d in durations])  # fmt: skip
    # Cold children: a warm spare starts before its task, so its spawn time would not
    # mark the start of the slot's work.
    # Leases as long as a deployment's order of magnitude (15 s, not the tests' 3 s): on
    # a loaded machine a 3 s lease is fenced now and then, which is not dispatch.
    env = worker_env(stage, MAX_CONCURRENT_CLAUDE=str(SLOTS), WARM_CHILDREN="0",
                     VISIBILITY_EXTENSION_INTERVAL="2000",
                     VISIBILITY_EXTENSION_AMOUNT="10")  # fmt: skip
    with workers(1, env, log_dir=work_dir) as fleet:
        wait_started(fleet)
        # The makespan comes from the side log; polling the queue meanwhile would make
        # moto count 200 messages every 50 ms, on the cores the worker needs.
        wait_side_log_ends(side_log, len(durations), timeout_s=120 + sum(durations))
        stage.wait_drained(timeout_s=60, poll_s=0.5)
        stop_all(fleet)
    return _measure(side_log, durations)


def baseline_run(
    server: MotoServer, durations: Sequence[float], work_dir: Path
) -> dict[str, float]:
    """Receive up to SLOTS, run them all, wait for all, delete, repeat."""
    stage = new_stage(server, prefix="s")
    side_log = work_dir / f"baseline-{len(durations)}-{time.time_ns()}.jsonl"
    stage.send([envelope("bench-work", {"seconds": d, "side_log": str(side_log)})
                for d in durations])  # fmt: skip
    definition = {d.name: d for d in load_file(BENCH_DEFINITIONS / "bench.yaml")}["bench-work"]
    env = child_environment({**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            home=str(work_dir))  # fmt: skip
    done = 0
    while done < len(durations):
        messages = stage.sqs.receive_message(
            QueueUrl=stage.queue_url, MaxNumberOfMessages=SLOTS, WaitTimeSeconds=1
        ).get("Messages", [])
        children = [_spawn(m, definition.to_dict(), env, work_dir) for m in messages]
        for child in children:
            child.wait(timeout=60)
        if messages:
            stage.sqs.delete_message_batch(
                QueueUrl=stage.queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                         for n, m in enumerate(messages)],
            )  # fmt: skip
        done += len(messages)
    return _measure(side_log, durations)


def _spawn(
    message: Mapping[str, Any], definition: dict[str, Any], env: dict[str, str], work_dir: Path
) -> subprocess.Popen[bytes]:
    body = json.loads(message["Body"])
    task_dir = Path(tempfile.mkdtemp(prefix="baseline-", dir=work_dir))
    task = {"requestId": body["requestId"], "tenant": body.get("tenant", "bench"), "attempt": 1,
            "jobId": None, "definition": definition, "input": body.get("input", {})}  # fmt: skip
    (task_dir / "task.json").write_text(json.dumps(task))
    return subprocess.Popen(
        [sys.executable, "-m", "worker.child", str(task_dir)],
        cwd=task_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run(server: MotoServer, *, quick: bool = False, tasks: int | None = None) -> dict[str, Any]:
    tasks = tasks or (24 if quick else 200)
    rng = random.Random(7)
    work_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-sat-"))
    results: dict[str, Any] = {"tasks": tasks, "slots": SLOTS, "workers": 1}
    for shape, uneven in (("even", False), ("uneven", True)):
        durations = _durations(tasks, uneven, rng)
        results[shape] = {
            "agentq": agentq_run(server, durations, work_dir),
            "batch_then_wait": baseline_run(server, durations, work_dir),
        }
    results["target"] = "agentq even ratio <= 1.10"
    return results
