"""The worker's main paths against moto's server, with real worker and child processes."""

from __future__ import annotations

import json

import pytest
from conftest import Stack
from support import wait_for
from worker_support import EventLog, queue_counts, running_worker, send, state

from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def test_worker_happy_path_completes_uploads_and_deletes(stack: Stack) -> None:
    events = EventLog(stack)
    with running_worker(stack) as worker:
        task = send(stack, "sample-echo", {"hello": "world"})
        completed = events.wait(task.request_id, "Task Completed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    assert worker.process is not None and worker.process.returncode == 0
    kinds = [t for t in events.types(task.request_id) if t != "Task Heartbeat"]
    assert kinds == ["Task Processing Started", "Task Completed"]
    record = state(stack, task)
    assert record is not None and record.state is TaskState.COMPLETED
    assert record.attempt == 1 and record.lease_token is None
    pointer = completed["payload"]["result"]
    assert record.raw["result"] == pointer
    body = stack.s3.get_object(Bucket=pointer["bucket"], Key=pointer["key"])["Body"].read()
    assert json.loads(body) == {"hello": "world"}
    assert pointer["key"] == f"task/logs/{task.request_id}/artifacts/task-result.json"
    stats = worker.stats()
    assert stats is not None and stats["verdicts"] == {"completed": 1}
    assert stats["awsCalls"]["sqs:ReceiveMessage"] >= 1
