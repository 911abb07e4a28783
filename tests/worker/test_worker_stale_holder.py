"""A stale holder's files never become the task's: S3 keys are scoped by attempt, and a
slow upload keeps its lease.

A worker frozen (SIGSTOP) past its lease while its child finishes, a second worker
completing the task, then the first resumed: it still settles what its child left, and
uploads before its token-fenced finalize is refused. Its objects must land in its own
attempt's folder, and every reader (the client, the CLI, job dispatch) must follow the
STATE item's pointer to the winner's. The task is bench.tasks:work, whose result names
the attempt that produced it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import forwarder, wait_for
from worker_support import running_worker, send, set_visibility_timeout, state

from agentq.client import AgentqClient
from agentq.events import now_ms
from agentq.local.workers import REPO_ROOT, SAMPLE_DEFINITIONS, WorkerProcess
from agentq.states import TaskState
from agentq.store.tasks import TaskRecord
from bench.stack import BENCH_DEFINITIONS

pytestmark = pytest.mark.timeout(240)


def _env(**overrides: str) -> dict[str, str]:
    paths = (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
    return {
        "TASK_DEFINITIONS_DIR": os.pathsep.join([str(BENCH_DEFINITIONS), str(SAMPLE_DEFINITIONS)]),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }


def _runs(side_log: Path, event: str, attempt: int) -> dict[str, Any] | None:
    if not side_log.exists():
        return None
    lines = [json.loads(line) for line in side_log.read_text().splitlines() if line.strip()]
    found = [r for r in lines if r["event"] == event and r["attempt"] == attempt]
    return found[-1] if found else None


def _verdicts(worker: WorkerProcess) -> list[str]:
    return [str(r.get("verdict")) for r in worker.log_records()
            if r.get("message") == "message settled"]  # fmt: skip


def _completed(stack: Stack, task: Any) -> TaskRecord | None:
    record = state(stack, task)
    return record if record is not None and record.state is TaskState.COMPLETED else None


def _keys(stack: Stack, prefix: str) -> set[str]:
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=prefix)
    return {str(o["Key"]).removeprefix(prefix) for o in listed.get("Contents", [])}


def test_stale_holder_that_finished_cannot_replace_the_winners_result(
    stack: Stack, tmp_path: Path
) -> None:
    set_visibility_timeout(stack, 4)
    side_log = tmp_path / "runs.jsonl"
    # A 6 s lease for the worker to be frozen, so its child (2 s) ends well inside it.
    with running_worker(stack, "stale", **_env(VISIBILITY_EXTENSION_AMOUNT="4")) as stale:
        task = send(stack, "bench-work", {"seconds": 2, "side_log": str(side_log)})
        wait_for(lambda: _runs(side_log, "start", 1), timeout=60, message="attempt 1 started")
        stale.send(signal.SIGSTOP)  # its child runs on and finishes; the worker sees nothing
        try:
            ended = wait_for(lambda: _runs(side_log, "end", 1), timeout=30,
                             message="attempt 1's child finished")  # fmt: skip
            assert ended["outcome"] == "ok"
            with running_worker(stack, "winner", **_env()) as winner:
                done = wait_for(lambda: _completed(stack, task), timeout=120,
                                message="the task completed by the second worker")  # fmt: skip
                assert done.attempt == 2
                stale.send(signal.SIGCONT)
                wait_for(lambda: _verdicts(stale), timeout=60, message="the stale verdict")
                assert _verdicts(stale) == ["lease_lost"], stale.output()[-3000:]
                winner.stop()
        finally:
            stale.send(signal.SIGCONT)
            stale.kill()
    final = state(stack, task)
    assert final is not None and final.state is TaskState.COMPLETED and final.attempt == 2
    # What `agentq status --result` shows: the output of the attempt that completed it.
    client = AgentqClient.from_env()
    assert client.result(task.request_id, tenant=task.tenant) == {"mode": "ok", "attempt": 2}
    folder = f"task/{task.tenant}/{task.request_id}/"
    assert final.raw["artifacts"]["prefix"] == f"{folder}attempt-2/"
    assert final.raw["result"]["key"] == f"{folder}attempt-2/artifacts/task-result.json"
    # The stale holder uploaded, but only into its own attempt's folder.
    assert "artifacts/task-result.json" in _keys(stack, f"{folder}attempt-1/")
    assert _keys(stack, f"{folder}attempt-2/") == {"artifacts/task-result.json"}
    assert set(client.artifacts(task.request_id, tenant=task.tenant)) == {
        "artifacts/task-result.json"
    }


def test_lease_is_renewed_while_a_slow_upload_runs(stack: Stack, tmp_path: Path) -> None:
    side_log = tmp_path / "runs.jsonl"
    with (
        forwarder(stack, "s3") as gate,
        running_worker(stack, "slow-s3", **_env(AWS_ENDPOINT_URL_S3=gate.url)) as worker,
    ):
        # The worker's start-up check of its bucket goes through first (a worker that
        # cannot reach its bucket does not start), then every S3 request waits. Held once
        # the worker says it started: a check still on its way when the gate closed would
        # hold the start-up itself (seen on a loaded host).
        wait_for(lambda: gate.connections >= 1, timeout=60, message="the start-up check")
        worker.wait_for_output("worker started", timeout=60)
        gate.hold()
        task = send(stack, "bench-work", {"seconds": 0.5, "side_log": str(side_log)})
        wait_for(lambda: _runs(side_log, "end", 1), timeout=60, message="the child finished")
        at_exit = state(stack, task)
        assert at_exit is not None and at_exit.effective_until_ms is not None
        # Well past the lease the task held when its child exited, the upload still hangs:
        # the lease must still be live, renewed by the heartbeat, or anyone could take over.
        lapsed = at_exit.effective_until_ms + 1500
        wait_for(lambda: now_ms() > lapsed, timeout=30, message="the first lease's end passed")
        held = state(stack, task)
        assert held is not None and held.state is TaskState.PROCESSING
        assert held.lease_live(), "the lease lapsed while the upload was in progress"
        gate.release()
        done = wait_for(lambda: _completed(stack, task), timeout=60, message="completed")
        assert done.attempt == 1
        worker.stop()
    assert _verdicts(worker) == ["completed"]
