"""Throughput scaling: no-op tasks/s with 1, 2 and 4 worker processes (4 slots each),
beside a raw boto3 loop on the same server (receive 10 → delete them in one batch) that
does nothing else: the ceiling the queue itself allows from one client.

Workers are started and idle first; the clock runs from the first send to the moment
the queue is empty (nothing visible, nothing in flight).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agentq.local.aws import MotoServer
from bench.stack import Stage, envelope, new_stage, stop_all, wait_started, worker_env, workers

SLOTS = 4


def agentq_rate(server: MotoServer, worker_count: int, tasks: int, log_dir: Path) -> float:
    stage = new_stage(server, prefix="t")
    env = worker_env(stage, MAX_CONCURRENT_CLAUDE=str(SLOTS), WAIT_TIME_SECONDS="2")
    with workers(worker_count, env, log_dir=log_dir, name=f"tp{worker_count}-") as fleet:
        wait_started(fleet)
        began = time.time()
        stage.send([envelope("bench-noop", {}) for _ in range(tasks)])
        done = stage.wait_drained(timeout_s=60 + tasks)
        stop_all(fleet)
    return tasks / (done - began)


def raw_rate(server: MotoServer, tasks: int) -> float:
    stage = new_stage(server, prefix="t")
    stage.send([envelope("bench-noop", {}) for _ in range(tasks)])
    return tasks / _drain(stage, tasks)


def _drain(stage: Stage, tasks: int) -> float:
    began = time.time()
    done = 0
    while done < tasks:
        messages = stage.sqs.receive_message(
            QueueUrl=stage.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        if messages:
            stage.sqs.delete_message_batch(
                QueueUrl=stage.queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                         for n, m in enumerate(messages)],
            )  # fmt: skip
        done += len(messages)
    return time.time() - began


def run(
    server: MotoServer,
    *,
    quick: bool = False,
    tasks: int | None = None,
    worker_counts: tuple[int, ...] = (1, 2, 4),
) -> dict[str, Any]:
    tasks = tasks or (30 if quick else 200)
    log_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-tp-"))
    raw = raw_rate(server, tasks)
    rows: list[dict[str, Any]] = []
    for count in worker_counts:
        rate = agentq_rate(server, count, tasks, log_dir)
        rows.append({"workers": count, "slots": count * SLOTS, "tasks_per_s": round(rate, 2),
                     "ratio_to_raw": round(rate / raw, 3)})  # fmt: skip
    return {"tasks": tasks, "raw_tasks_per_s": round(raw, 1), "workers": rows}
