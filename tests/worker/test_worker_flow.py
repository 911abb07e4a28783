"""The worker's main paths against moto's server, with real worker and child processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state

from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def test_worker_happy_path_completes_uploads_and_deletes(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    work_dir = tmp_path / "work"
    with running_worker(stack, AGENTQ_WORK_DIR=str(work_dir)) as worker:
        task = send(stack, "sample-echo", {"hello": "world"})
        files = send(
            stack,
            "sample-artifacts",
            {"files": {"artifacts/extra.txt": "x", "logs/summary.log": "done", "junk.tmp": "no"}},
        )
        completed = events.wait(task.request_id, "Task Completed")[0]
        events.wait(files.request_id, "Task Completed")
        wait_for(lambda: queue_counts(stack) == (0, 0), message="messages deleted")
        worker.stop()
    assert worker.process is not None and worker.process.returncode == 0
    kinds = [t for t in events.types(task.request_id) if t != "Task Heartbeat"]
    assert kinds == ["Task Processing Started", "Task Completed"]
    record = state(stack, task)
    assert record is not None and record.state is TaskState.COMPLETED
    assert record.attempt == 1 and record.lease_token is None
    pointer = completed["payload"]["result"]
    assert record.raw["result"] == pointer
    assert record.raw["durationMs"] == completed["payload"]["duration_ms"] > 0
    body = stack.s3.get_object(Bucket=pointer["bucket"], Key=pointer["key"])["Body"].read()
    assert json.loads(body) == {"hello": "world"}
    # Scoped by tenant and attempt; the STATE item names the folder and the result in it.
    folder = f"task/acme/{task.request_id}/attempt-1/"
    assert pointer["key"] == f"{folder}artifacts/task-result.json"
    assert record.raw["artifacts"] == {"bucket": stack.resources.bucket, "prefix": folder}
    files_record = state(stack, files)
    assert files_record is not None
    files_folder = files_record.raw["artifacts"]["prefix"]
    assert files_folder == f"task/acme/{files.request_id}/attempt-1/"
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=files_folder)
    keys = {o["Key"].removeprefix(files_folder) for o in listed["Contents"]}
    assert keys == {"artifacts/task-result.json", "artifacts/extra.txt", "logs/summary.log"}
    # DELETE_FILES_AFTER_UPLOAD (default on): nothing of the tasks is left locally.
    assert not [p for p in work_dir.iterdir() if p.name.startswith("agentq-r-")]
    stats = worker.stats()
    assert stats is not None and stats["verdicts"] == {"completed": 2}
    assert stats["awsCalls"]["sqs:ReceiveMessage"] >= 1


def test_worker_deletes_a_duplicate_of_a_completed_task_without_running_it(
    stack: Stack, tmp_path: Path
) -> None:
    events = EventLog(stack)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack) as worker:
        task = send(stack, "sample-echo", {"side_log": str(side_log)})
        events.wait(task.request_id, "Task Completed")
        send(stack, "sample-echo", {"side_log": str(side_log)}, request_id=task.request_id)
        worker.wait_for_output('"verdict":"duplicate"')
        wait_for(lambda: queue_counts(stack) == (0, 0), message="duplicate deleted")
        # The duplicate re-sends the terminal event stored on the STATE item (the outbox
        # that covers a crash between finishing and publishing): the same event, not a
        # second ending, so save-event and the dispatcher store and count it once.
        resent = events.wait(task.request_id, "Task Completed", count=2)
        worker.stop()
    assert len(side_log.read_text().splitlines()) == 1
    assert len(events.of(task.request_id, "Task Processing Started")) == 1
    assert len(resent) == 2
    assert resent[0] == resent[1]
    record = state(stack, task)
    assert record is not None and record.raw["terminalEvent"]["eventId"] == resent[0]["eventId"]


BAD_MESSAGES: list[tuple[str, dict[str, str]]] = [
    ("{not json", {"requestId": "bad-body-1"}),  # malformed body
    (json.dumps({"definition": "sample-echo"}), {"requestId": "bad id with spaces"}),
    (json.dumps({"definition": "sample-echo"}), {"requestId": "a" * 300}),  # oversized
    (json.dumps({"definition": "sample-echo"}), {}),  # no request id at all
    (json.dumps({"requestId": "no-such-def-1", "definition": "no-such-definition"}), {}),
    (json.dumps(["not", "an", "object"]), {"requestId": "bad-shape-1"}),
]


def test_worker_rejects_bad_messages_and_keeps_running(stack: Stack) -> None:
    events = EventLog(stack)
    for body, attributes in BAD_MESSAGES:
        stack.sqs.send_message(
            QueueUrl=stack.resources.queue_url,
            MessageBody=body,
            MessageAttributes={
                name: {"DataType": "String", "StringValue": value}
                for name, value in attributes.items()
            },
        )
    with running_worker(stack) as worker:
        wait_for(
            lambda: worker.output().count('"verdict":"rejected"') == len(BAD_MESSAGES),
            timeout=60,
            message="every bad message rejected",
        )
        good = send(stack, "sample-noop")
        events.wait(good.request_id, "Task Completed")
        wait_for(lambda: queue_counts(stack) == (0, 0), message="bad messages deleted")
        assert worker.alive()
        worker.stop()
    failed = [e for e in events.poll() if e["detail-type"] == "Task Failed"]
    assert len(failed) == len(BAD_MESSAGES)
    for event in failed:
        error = event["payload"]["error"]
        assert error["category"] in ("validation", "parse", "not_found"), error
        assert error["retryable"] is False
    assert {e["requestId"] for e in failed} >= {"bad-body-1", "no-such-def-1", "bad-shape-1"}
    started = [e for e in events.events if e["detail-type"] == "Task Processing Started"]
    assert [e["requestId"] for e in started] == [good.request_id]
    assert queue_counts(stack, stack.resources.dlq_url) == (0, 0)


def test_worker_child_env_and_output(stack: Stack) -> None:
    """Two tasks in one worker run: the child's environment holds no AWS variable, and
    its output reaches the worker's log line by line with the task's prefix."""
    events = EventLog(stack)
    env = {"ANTHROPIC_API_KEY": "sk-test-not-a-key", "AGENTQ_MARKER": "1"}
    with running_worker(stack, **env) as worker:
        listing = send(stack, "sample-env")
        chatter = send(stack, "sample-chatter", {"lines": 2000, "width": 100})
        completed = events.wait(listing.request_id, "Task Completed")[0]
        events.wait(chatter.request_id, "Task Completed")
        worker.stop()

    pointer = completed["payload"]["result"]
    names = json.loads(
        stack.s3.get_object(Bucket=pointer["bucket"], Key=pointer["key"])["Body"].read()
    )["names"]
    assert not [n for n in names if n.startswith("AWS_")]
    assert {"ANTHROPIC_API_KEY", "AGENTQ_MARKER", "HOME", "PATH"} <= set(names)
    assert "SQS_QUEUE_URL" not in names and "S3_BUCKET" not in names

    prefixed = [
        r for r in worker.log_records()
        if str(r.get("message", "")).startswith(f"[task:{chatter.request_id}] line ")
    ]  # fmt: skip
    assert len(prefixed) == 2000
    assert {r["stream"] for r in prefixed} == {"stdout", "stderr"}
    assert {r["requestId"] for r in prefixed} == {chatter.request_id}
    metrics = [r for r in worker.log_records() if "_aws" in r]
    names = {m["Name"] for r in metrics for d in r["_aws"]["CloudWatchMetrics"]
             for m in d["Metrics"]}  # fmt: skip
    assert {"TasksStarted", "TasksCompleted", "TaskDuration", "QueueWait", "LockLatency",
            "SlotsBusy"} <= names  # fmt: skip
    # One lock time per task started, each a round trip to the table: never negative,
    # never the seconds a task runs.
    locks = [
        v for r in metrics if "stage" in r and "tier" not in r for v in r.get("LockLatency", [])
    ]
    assert len(locks) == 2 and all(0 <= v < 5_000 for v in locks), locks
