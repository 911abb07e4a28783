"""Failures, retries, timeouts and the DLQ, with real worker and child processes."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state

from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def test_worker_failure_paths(stack: Stack) -> None:
    """Five tasks in one worker run (they share its slots, and the test's time):

    - fails once with a retryable error → back after the backoff, completes on attempt 2;
    - fails every time → `Task Failed` on attempt 3, message deleted (no DLQ wait);
    - allows 5 attempts, more than the queue's 3 receives → the third failure's message
      goes to the DLQ, for the DLQ processor to close out;
    - a programming error, and a definition naming a missing callable → `Task Failed` on
      attempt 1, never retried.
    """
    events = EventLog(stack)
    with running_worker(stack) as worker:
        once = send(stack, "sample-fail", {"category": "rate_limit", "times": 1})
        always = send(stack, "sample-fail", {"category": "server"})
        patient = send(stack, "sample-fail-patient", {"category": "network"})
        bug = send(stack, "sample-fail", {"category": "programming", "message": "bug"})
        broken = send(stack, "sample-broken")
        completed = events.wait(once.request_id, "Task Completed")[0]
        failed = events.wait(always.request_id, "Task Failed")[0]
        events.wait(patient.request_id, "Task Processing Failed", count=3)
        bug_failed = events.wait(bug.request_id, "Task Failed")[0]
        broken_failed = events.wait(broken.request_id, "Task Failed")[0]
        wait_for(
            lambda: queue_counts(stack, stack.resources.dlq_url)[0] == 1,
            timeout=30,
            message="the patient task's message in the DLQ",
        )
        wait_for(lambda: queue_counts(stack) == (0, 0), message="task queue empty")
        worker.stop()

    assert completed["attempt"] == 2
    retried = events.of(once.request_id, "Task Processing Failed")
    assert len(retried) == 1 and retried[0]["attempt"] == 1
    assert retried[0]["payload"]["error"]["category"] == "rate_limit"
    second_start = events.of(once.request_id, "Task Processing Started")[-1]
    assert second_start["attempt"] == 2
    assert second_start["timestampMs"] >= retried[0]["payload"]["retryAt"]
    record = state(stack, once)
    assert record is not None and record.state is TaskState.COMPLETED and record.attempt == 2

    assert failed["attempt"] == 3
    assert len(events.of(always.request_id, "Task Processing Failed")) == 2
    record = state(stack, always)
    assert record is not None and record.state is TaskState.FAILED
    assert record.raw["error"]["category"] == "server"

    assert not events.of(patient.request_id, "Task Failed")
    record = state(stack, patient)
    assert record is not None and record.state is TaskState.RETRYING and record.attempt == 3
    dead = stack.sqs.receive_message(
        QueueUrl=stack.resources.dlq_url, MessageAttributeNames=["All"]
    )["Messages"][0]
    assert dead["MessageAttributes"]["requestId"]["StringValue"] == patient.request_id

    assert bug_failed["attempt"] == 1
    error = bug_failed["payload"]["error"]
    assert (error["category"], error["retryable"], error["exception_type"]) == (
        "programming",
        False,
        "TypeError",
    )
    # Where the task's code raised, not only what: `bug` alone says nothing.
    assert error["message"].startswith("bug (at __init__.py:") and error["message"].endswith(
        " in fail)"
    )
    assert not events.of(bug.request_id, "Task Processing Failed")
    assert broken_failed["attempt"] == 1
    assert broken_failed["payload"]["error"]["category"] == "not_found"


def test_worker_timeout_kills_the_whole_process_group(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    pid_file = tmp_path / "grandchild.pid"
    with running_worker(stack, CLAUDE_TIMEOUT="6000", CLAUDE_KILL_GRACE="500") as worker:
        task = send(stack, "sample-grandchild", {"pid_file": str(pid_file), "seconds": 60})
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), message="grandchild pid")
        grandchild = int(pid_file.read_text())
        assert psutil.pid_exists(grandchild)
        timeout = events.wait(task.request_id, "Task Timeout")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()

    def gone() -> bool:
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_for(gone, timeout=5, message="grandchild killed")
    assert timeout["payload"]["error"]["category"] == "timeout"
    record = state(stack, task)
    assert record is not None and record.state is TaskState.TIMEOUT
    assert not events.of(task.request_id, "Task Completed")
