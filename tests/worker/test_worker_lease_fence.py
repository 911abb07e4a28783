"""An attempt never outlives its lease, so a takeover never overlaps it (worker/child/leasefile.py).

A frozen worker (SIGSTOP) renews nothing: its child's watchdog ends the attempt before
the lease lapses, and the next worker completes the task once. A worker cut off from
DynamoDB still runs: it stops the child itself (`lease_lost`) and leaves the task alone.
The task is bench.tasks:work, which records its start and its end (also on SIGTERM) in
a side log: the executions are what the assertions read.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import forwarder, wait_for
from worker_support import running_worker, send, set_visibility_timeout, state

from agentq.local.workers import REPO_ROOT, SAMPLE_DEFINITIONS, WorkerProcess
from agentq.states import TaskState
from agentq.store.tasks import TaskRecord
from bench.stack import BENCH_DEFINITIONS
from worker.child.leasefile import LEASE_FILE

pytestmark = pytest.mark.timeout(240)


def _env(**overrides: str) -> dict[str, str]:
    paths = (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
    return {
        "TASK_DEFINITIONS_DIR": os.pathsep.join([str(BENCH_DEFINITIONS), str(SAMPLE_DEFINITIONS)]),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }


def _runs(side_log: Path) -> list[dict[str, Any]]:
    if not side_log.exists():
        return []
    return [json.loads(line) for line in side_log.read_text().splitlines() if line.strip()]


def _line(side_log: Path, event: str, attempt: int) -> dict[str, Any] | None:
    found = [r for r in _runs(side_log) if r["event"] == event and r["attempt"] == attempt]
    return found[-1] if found else None


def _lease_file_of(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return (Path(os.readlink(f"/proc/{pid}/cwd")) / LEASE_FILE).is_file()
    return False


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # unreaped
    except OSError:
        return True


def _completed(stack: Stack, task: Any) -> TaskRecord | None:
    record = state(stack, task)
    return record if record is not None and record.state is TaskState.COMPLETED else None


def _verdicts(worker: WorkerProcess) -> list[str]:
    return [str(r.get("verdict")) for r in worker.log_records()
            if r.get("message") == "message settled"]  # fmt: skip


def _assert_one_run_after_the_other(side_log: Path) -> None:
    runs = _runs(side_log)
    first_end, second_start = _line(side_log, "end", 1), _line(side_log, "start", 2)
    assert first_end is not None and second_start is not None, runs
    assert first_end["outcome"] == "terminated", runs
    assert second_start["t"] > first_end["t"], runs
    assert [(r["attempt"], r["outcome"]) for r in runs if r["event"] == "end"] == [
        (1, "terminated"),
        (2, "ok"),
    ], runs


def test_worker_lease_frozen_worker_child_ends_before_its_lease_lapses(
    stack: Stack, tmp_path: Path
) -> None:
    set_visibility_timeout(stack, 4)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack, "frozen", **_env()) as frozen:
        task = send(stack, "bench-work", {"seconds": 8, "side_log": str(side_log)})
        started = wait_for(lambda: _line(side_log, "start", 1), timeout=60,
                           message="the first attempt started")  # fmt: skip
        child = int(started["pid"])
        wait_for(lambda: _lease_file_of(child), timeout=30, message="the lease mirrored")
        frozen.send(signal.SIGSTOP)  # no heartbeat, no renewal, no fence of its own
        try:
            ended = wait_for(lambda: _line(side_log, "end", 1), timeout=30,
                             message="the child's watchdog ended the attempt")  # fmt: skip
            record = state(stack, task)
            assert record is not None and record.effective_until_ms is not None
            # Ended (SIGTERM, recorded by the task) before anyone else could take over.
            assert ended["t"] * 1000 < record.effective_until_ms
            wait_for(lambda: _gone(child), timeout=10, message="the child process gone")
            with running_worker(stack, "rescuer", **_env()) as rescuer:
                done = wait_for(lambda: _completed(stack, task), timeout=120,
                                message="the task completed by the rescuer")  # fmt: skip
                assert done.attempt == 2
                assert str(done.raw["terminalEvent"]["workerId"]).startswith("rescuer")
                # The frozen worker wakes up: its attempt ended on a lost lease and it
                # settles nothing (the child's record said LeaseExpired, finalize refused).
                frozen.send(signal.SIGCONT)
                wait_for(lambda: _verdicts(frozen), timeout=60, message="the frozen verdict")
                assert _verdicts(frozen) == ["lease_lost"], frozen.output()[-3000:]
                rescuer.stop()
        finally:
            frozen.send(signal.SIGCONT)
            frozen.kill()
    _assert_one_run_after_the_other(side_log)
    final = state(stack, task)
    assert final is not None and final.state is TaskState.COMPLETED and final.attempt == 2
    # The frozen holder's LeaseExpired error.json went to its own attempt's folder, not
    # beside the result of the attempt that completed the task.
    winner_folder = str(final.raw["result"]["key"]).removesuffix("artifacts/task-result.json")
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=winner_folder)
    assert "error.json" not in {o["Key"].removeprefix(winner_folder) for o in listed["Contents"]}


def test_worker_lease_worker_cut_off_from_dynamodb_stops_its_child(
    stack: Stack, tmp_path: Path
) -> None:
    set_visibility_timeout(stack, 4)
    side_log = tmp_path / "runs.jsonl"
    with (
        forwarder(stack, "dynamodb") as cable,
        running_worker(stack, "cut", **_env(AWS_ENDPOINT_URL_DYNAMODB=cable.url)) as worker,
    ):
        task = send(stack, "bench-work", {"seconds": 8, "side_log": str(side_log)})
        started = wait_for(lambda: _line(side_log, "start", 1), timeout=60,
                           message="the first attempt started")  # fmt: skip
        wait_for(lambda: _lease_file_of(int(started["pid"])), timeout=30,
                 message="the lease mirrored")  # fmt: skip
        cable.cut()  # the worker, its heartbeat and its child go on; DynamoDB is gone
        record = state(stack, task)  # read past the cable: the lease the worker last won
        assert record is not None and record.effective_until_ms is not None
        ended = wait_for(lambda: _line(side_log, "end", 1), timeout=30,
                         message="the worker stopped its child")  # fmt: skip
        assert ended["t"] * 1000 < record.effective_until_ms
        wait_for(
            lambda: "lease_lost" in _verdicts(worker),
            timeout=30,
            message="the worker's own verdict: lease lost, task and message untouched",
        )
        cable.mend()
        done = wait_for(lambda: _completed(stack, task), timeout=120,
                        message="the task completed once DynamoDB was back")  # fmt: skip
        assert done.attempt == 2
        worker.stop()
    _assert_one_run_after_the_other(side_log)
