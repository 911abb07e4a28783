"""Memory: the worker's RSS idle and with every slot busy (its children excluded), and a
`python` task child's RSS. The `agent` child's RSS (with the Claude CLI it starts) comes
from bench.bench_agent, which runs it against the offline model server.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import psutil

from agentq.local.aws import MotoServer
from bench.stack import (
    envelope,
    new_stage,
    read_side_log,
    stop_all,
    wait_started,
    worker_env,
    workers,
)

SLOTS: Final = 4
MB: Final = 1024 * 1024


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MB


def _busy_children(side_log: Path, count: int, timeout_s: float = 60.0) -> list[int]:
    """Pids of `count` children once each has started its task code (side log)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = [r["pid"] for r in read_side_log(side_log) if r["event"] == "start"]
        if len(started) >= count:
            return [int(pid) for pid in started]
        time.sleep(0.05)
    raise TimeoutError(f"{count} children never ran together")


def run(server: MotoServer, *, quick: bool = False, task_seconds: float = 6.0) -> dict[str, Any]:
    stage = new_stage(server, prefix="m")
    log_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-mem-"))
    env = worker_env(stage, MAX_CONCURRENT_CLAUDE=str(SLOTS), WAIT_TIME_SECONDS="2")
    with workers(1, env, log_dir=log_dir) as fleet:
        worker = fleet[0]
        wait_started(fleet)
        time.sleep(1.0)  # let start-up allocations settle before the idle reading
        idle = _rss_mb(worker.pid)
        side_log = log_dir / "side.jsonl"
        payload = {"seconds": task_seconds, "side_log": str(side_log)}
        stage.send([envelope("bench-work", payload) for _ in range(SLOTS)])
        children = _busy_children(side_log, SLOTS)
        busy = _rss_mb(worker.pid)
        child_rss = [_rss_mb(pid) for pid in children if psutil.pid_exists(pid)]
        stage.wait_drained(timeout_s=60)
        stop_all(fleet)
    return {
        "slots": SLOTS,
        "worker_idle_mb": round(idle, 1),
        "worker_busy_mb": round(busy, 1),
        "python_child_mb": round(statistics.median(child_rss), 1),
        "agent_child_mb": None,  # filled from bench.bench_agent when it ran
    }
