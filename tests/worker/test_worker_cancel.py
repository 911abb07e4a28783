"""Cancelling a running task: a real worker stops the child's whole process group
within one heartbeat, records `Task Cancelled` and deletes the message; a job task's
cancellation goes through the job's failure policy."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.errors import NotCancellable
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import SAMPLE_DEFINITIONS
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def _client(monkeypatch: pytest.MonkeyPatch) -> AgentqClient:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    return AgentqClient.from_env()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cancel_stops_a_running_child_and_its_group_within_a_heartbeat(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client = _client(monkeypatch)
    events = EventLog(stack)
    pid_file = tmp_path / "grandchild.pid"
    # The child and its grandchild both ignore SIGTERM: only the group kill ends them.
    record = client.submit("sample-grandchild", {"seconds": 90, "pid_file": str(pid_file)})
    with running_worker(stack) as worker:
        events.wait(record.request_id, "Task Processing Started")
        grandchild = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(),
                                  message="the grandchild's pid"))  # fmt: skip
        [answer] = client.cancel(record.request_id)
        # Running: asked to stop, and the answer says so (not "cancelled").
        assert (answer.request_id, answer.outcome, answer.state) == (
            record.request_id, "requested", "PROCESSING")  # fmt: skip
        flagged = client.get_task(record.request_id)
        assert flagged.state is TaskState.PROCESSING and flagged.raw["cancelRequested"] is True
        # One heartbeat is 0.3 s here, the kill grace 0.5 s: the deadline only bounds a hang.
        wait_for(lambda: _gone(grandchild), timeout=20, message="the grandchild killed")
        cancelled = events.wait(record.request_id, "Task Cancelled")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="the message deleted")
        assert "cancel requested; stopping the task" in worker.output()

    final = client.get_task(record.request_id)
    assert final.state is TaskState.CANCELLED and final.attempt == 1
    assert final.raw["terminalEvent"]["eventId"] == cancelled["eventId"]
    assert cancelled["attempt"] == 1
    assert not events.of(record.request_id, "Task Failed")
    assert not events.of(record.request_id, "Task Processing Failed")
    with pytest.raises(NotCancellable, match="already CANCELLED"):
        client.cancel(record.request_id)


def test_a_cancelled_running_job_task_fails_its_job_by_policy(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client(monkeypatch)
    spec = {
        "failure_policy": "fail_fast",
        "tasks": {
            "A": {"definition": "sample-sleep", "input": {"seconds": 90}},
            "B": {"definition": "sample-echo", "input": {"a": "${tasks.A.result}"}},
        },
    }
    with (
        LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                   serve_dlq=False),
        running_worker(stack),
    ):  # fmt: skip
        client.create_job(spec, job_id="cancelme")
        # The Lambda host consumes the events here: watch the STATE item instead.
        wait_for(lambda: client.get_task("cancelme-A").state is TaskState.PROCESSING,
                 timeout=60, message="A running")  # fmt: skip
        assert [(a.request_id, a.outcome) for a in client.cancel("cancelme-A")] == [
            ("cancelme-A", "requested")]  # fmt: skip
        client.wait(job_id="cancelme", timeout_s=60, poll_s=0.2)

    job = client.get_job("cancelme")
    assert job.state == "FAILED"
    tasks = client.job_tasks(job)
    a, b = tasks["A"], tasks["B"]
    assert a is not None and a.state is TaskState.CANCELLED and a.attempt == 1
    assert b is not None and b.state is TaskState.CANCELLED
    assert "A" in str(b.raw["cancelReason"])
