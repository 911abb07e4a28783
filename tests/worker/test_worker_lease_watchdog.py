"""A frozen worker's child does not outlive its lease, so a takeover never overlaps it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import wait_for
from worker_support import running_worker, send, set_visibility_timeout, state

from agentq.local.workers import WorkerProcess
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(240)


def _task_child(worker: WorkerProcess, request_id: str) -> psutil.Process | None:
    for process in worker.task_children():
        try:
            if Path(process.cwd()).name.startswith(f"agentq-{request_id[:40]}-"):
                return process
        except psutil.Error:
            continue
    return None


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # its frozen parent cannot reap it
    except psutil.NoSuchProcess:
        return True


def test_worker_frozen_worker_child_dies_with_its_lease(stack: Stack, tmp_path: Path) -> None:
    set_visibility_timeout(stack, 4)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack, "frozen") as frozen:
        task = send(stack, "sample-sleep", {"seconds": 12, "side_log": str(side_log)})
        child = wait_for(lambda: _task_child(frozen, task.request_id), timeout=60,
                         message="the task's child")  # fmt: skip
        frozen.send(signal.SIGSTOP)  # no more heartbeats, no more renewals
        try:
            # The lease is 3 s (fast_env); the child's watchdog ends it, not the worker.
            wait_for(lambda: _gone(child), timeout=20, message="the child ended with its lease")
            with running_worker(stack, "rescuer") as rescuer:
                record = wait_for(
                    lambda: (
                        (r := state(stack, task)) is not None
                        and r.state is TaskState.COMPLETED
                        and r
                    ),
                    timeout=120,
                    message="the task completed by another worker",
                )
                rescuer.stop()
        finally:
            frozen.send(signal.SIGCONT)
            frozen.kill()
    runs = [json.loads(line) for line in side_log.read_text().splitlines()]
    # The frozen attempt never finished; exactly one run did, on the next attempt.
    assert [run["attempt"] for run in runs] == [2]
    assert record.attempt == 2
    assert str(record.raw["terminalEvent"]["workerId"]).startswith("rescuer")
