"""Guards around a task: a lost lease, too many receives, ECS scale-in protection."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state, store

from agentq.events import now_ms
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def test_worker_stops_the_child_when_its_lease_is_taken(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack) as worker:
        task = send(stack, "sample-sleep", {"seconds": 20, "side_log": str(side_log)})
        events.wait(task.request_id, "Task Processing Started")
        # Another worker takes the task over (as after a long GC pause or a partition).
        stack.dynamodb.update_item(
            TableName=stack.resources.table_name,
            Key={"PK": {"S": f"TASK#{task.tenant}#{task.request_id}"}, "SK": {"S": "STATE"}},
            UpdateExpression="SET leaseToken = :t, effectiveUntil = :eu, #o = :o",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={
                ":t": {"S": "someone-elses-token"},
                ":eu": {"N": str(now_ms() + 60_000)},
                ":o": {"S": "other-worker"},
            },
        )
        worker.wait_for_output('"verdict":"lease_lost"', timeout=30)
        worker.stop()
    assert not side_log.exists(), "the child was stopped before it finished"
    assert not events.of(task.request_id, "Task Completed")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.PROCESSING
    assert record.lease_token == "someone-elses-token"
    assert sum(queue_counts(stack)) == 1, "the new holder's message is never deleted"


def test_worker_ends_a_task_received_more_often_than_allowed(stack: Stack) -> None:
    events = EventLog(stack)
    task = send(stack, "sample-echo")
    store(stack).create(task)
    received = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=2)
    handle = received["Messages"][0]["ReceiptHandle"]
    stack.sqs.change_message_visibility(
        QueueUrl=stack.resources.queue_url, ReceiptHandle=handle, VisibilityTimeout=0
    )
    with running_worker(stack, MAX_MESSAGE_RETRIES="1") as worker:
        failed = events.wait(task.request_id, "Task Failed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    assert failed["payload"]["error"]["exception_type"] == "MaxReceivesExceeded"
    assert not events.of(task.request_id, "Task Processing Started")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.FAILED


class _Agent(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]]

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.calls.append({"path": self.path, "body": json.loads(self.rfile.read(length))})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"protection": {}}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ecs_agent() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    handler = type("Agent", (_Agent,), {"calls": calls})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


def test_worker_protects_its_ecs_task_while_busy(
    stack: Stack, ecs_agent: tuple[str, list[dict[str, Any]]]
) -> None:
    uri, calls = ecs_agent
    events = EventLog(stack)
    with running_worker(stack, ECS_AGENT_URI=uri) as worker:
        task = send(stack, "sample-sleep", {"seconds": 1})
        events.wait(task.request_id, "Task Completed")
        wait_for(lambda: len(calls) >= 2, message="protection on and off")
        worker.stop()
    assert [c["path"] for c in calls] == ["/task-protection/v1/state"] * 2
    assert calls[0]["body"]["ProtectionEnabled"] is True
    assert calls[0]["body"]["ExpiresInMinutes"] > 0
    assert calls[1]["body"] == {"ProtectionEnabled": False}


def test_worker_fails_a_task_whose_attempts_are_used_up(stack: Stack) -> None:
    events = EventLog(stack)
    task = send(stack, "sample-echo")
    store(stack).create(task)
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": f"TASK#{task.tenant}#{task.request_id}"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET #s = :s, attempt = :a",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "RETRYING"}, ":a": {"N": "3"}},
    )
    with running_worker(stack) as worker:
        failed = events.wait(task.request_id, "Task Failed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    assert failed["payload"]["reason"] == "attempts exhausted"
    assert not events.of(task.request_id, "Task Processing Started")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.FAILED and record.attempt == 3
