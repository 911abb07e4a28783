"""A task's own `resume` decides over its definition's, on the worker.

The worker's real parts in process (tests/faults/worker_parts.py) run one attempt each
through the real task child, the bundled CLI and the offline model server, against
moto: a task with resume: true of a definition without resume is offered attempt 1's
checkpoint and its session is uploaded; a task with resume: false of a definition with
resume: true is offered nothing and nothing is uploaded. A checkpoint cut short is put
under attempt 1 beforehand: an attempt that reads it says so, one that does not starts
plainly, and only an uploader replaces it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_support import agent_definition, write_definitions
from conftest import Stack

from agentq.checkpoints import decode, read_attempt
from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer
from agentq.store.keys import checkpoint_key, task_prefix
from agentq.store.tenants import TenantLimitStore

# The worker's parts, importable however this module is collected (pytest puts only a
# test's own directory on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from worker_parts import LONG_LEASE, Parts, send_and_receive, worker_parts

# Each test runs a task child, and the CLI in it.
pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

# What a crash in the middle of a copy would leave: a cut transcript.
CUT = b'{"agentq_checkpoint": 1, "session_id": "6c1f5bd0-0000-4000-8000-00000000000'
SCRIPT = '[[model: key {key}; tool Bash {{"command": "echo one"}}]]'
SETTINGS = {"allowed_tools": ["Bash"], "retry_attempts": 1}


@contextmanager
def _worker(stack: Stack, scratch: Path) -> Iterator[tuple[Parts, ModelServer, Path]]:
    """The worker's parts with two agent definitions, `plain` (no resume) and `kept`
    (resume: true), their children pointed at a fresh model server; the task dirs stay
    under the returned work dir."""
    definitions = write_definitions(scratch / "definitions", [
        agent_definition("plain", settings=SETTINGS),
        agent_definition("kept", settings={**SETTINGS, "resume": True}),
    ])  # fmt: skip
    work = scratch / "work"
    work.mkdir()
    model = ModelServer().start()
    try:
        parts = worker_parts(
            stack,
            env={**LONG_LEASE, "TASK_DEFINITIONS_DIR": str(definitions),
                 "AGENTQ_WORK_DIR": str(work), "DELETE_FILES_AFTER_UPLOAD": "false"},
            environ={**os.environ, **offline_claude_env(model.url, scratch / "home")},
        )  # fmt: skip
        yield parts, model, work
    finally:
        model.stop()


def _run(stack: Stack, parts: Parts, definition: str, key: str, resume: bool) -> str:
    """One attempt of a task with its own `resume`, attempt 1's checkpoint cut beforehand;
    returns its request id once it completed."""
    request_id = f"ag-{key}"
    stack.s3.put_object(Bucket=stack.resources.bucket,
                        Key=checkpoint_key("acme", request_id, 1), Body=CUT)  # fmt: skip
    _, message, entry = send_and_receive(
        stack, definition, request_id=request_id,
        input={"text": f"Go. {SCRIPT.format(key=key)}"}, resume=resume,
    )  # fmt: skip
    parts.inflight.add(entry)
    verdict = parts.handler.handle(message, entry=entry)
    assert parts.batcher.flush()
    assert verdict == "completed", [e.payload for e in parts.sink.events]
    return request_id


def _task_json(work: Path, request_id: str) -> dict[str, Any]:
    """What the worker gave the task's child (its task dir is kept)."""
    [found] = work.glob(f"agentq-{request_id[:40]}-*/task.json")
    data: dict[str, Any] = json.loads(found.read_text())
    return data


def _completed(parts: Parts) -> dict[str, Any]:
    [event] = parts.sink.of("Task Completed")
    return dict(event.payload)


def _checkpoint_objects(stack: Stack, request_id: str) -> list[str]:
    listing = stack.s3.list_objects_v2(Bucket=stack.resources.bucket,
                                       Prefix=task_prefix("acme", request_id))  # fmt: skip
    return [o["Key"] for o in listing.get("Contents", []) if "/checkpoint/" in o["Key"]]


def test_a_task_with_resume_on_is_offered_its_checkpoint_and_its_session_uploaded(
    stack: Stack, tmp_path: Path
) -> None:
    with _worker(stack, tmp_path) as (parts, model, work):
        request_id = _run(stack, parts, "plain", "on", resume=True)
        requests = model.requests("on")

    task = _task_json(work, request_id)
    # The worker fetched attempt 1's checkpoint from S3 for the child, and told it so.
    assert task["resume"] == {"from_attempt": 1, "parts": 0}
    assert task["definition"]["settings"]["resume"] is True
    resume = _completed(parts)["resume"]
    assert resume["status"] == "fresh"
    assert resume["reason"].startswith("checkpoint of attempt 1 is corrupt")
    assert [r.outcome for r in requests] == ["tool_use:Bash", "tool_use:StructuredOutput"]
    # The uploader ran: the winning attempt's session replaced the cut checkpoint, and the
    # STATE item names it (what a retry resumes and a continuation starts from).
    record = parts.store.require("acme", request_id)
    assert record.raw["checkpoint"]["key"] == checkpoint_key("acme", request_id, 1)
    stored = read_attempt(stack.s3, stack.resources.bucket, "acme", request_id, 1)
    assert stored is not None and decode(stored.data).turns == 2


def test_a_task_with_resume_off_is_offered_nothing_and_uploads_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    with _worker(stack, tmp_path) as (parts, model, work):
        request_id = _run(stack, parts, "kept", "off", resume=False)
        requests = model.requests("off")

    task = _task_json(work, request_id)
    assert "resume" not in task  # nothing read from S3 for it
    assert task["definition"]["settings"]["resume"] is False
    assert "resume" not in _completed(parts)  # the child kept no session
    assert requests[0].turn == 0
    record = parts.store.require("acme", request_id)
    assert "checkpoint" not in record.raw
    # Only the cut checkpoint put there beforehand: no part, no whole one replaced it.
    assert _checkpoint_objects(stack, request_id) == [checkpoint_key("acme", request_id, 1)]
    body = stack.s3.get_object(Bucket=stack.resources.bucket,
                               Key=checkpoint_key("acme", request_id, 1))["Body"].read()  # fmt: skip
    assert body == CUT


def test_resume_on_for_a_tenant_without_transcripts_is_recorded_off_not_refused(
    stack: Stack, tmp_path: Path
) -> None:
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set_transcripts(
        "acme", stored=False
    )
    with _worker(stack, tmp_path) as (parts, _, work):
        request_id = _run(stack, parts, "plain", "hush", resume=True)

    assert _task_json(work, request_id)["resume"]["off"].startswith("tenant acme does not store")
    resume = _completed(parts)["resume"]
    assert resume["status"] == "off"
    assert "does not store transcripts" in resume["reason"]
    record = parts.store.require("acme", request_id)
    assert record.raw.get("transcripts") == "off" and "checkpoint" not in record.raw
    # Nothing was read or written: the cut checkpoint put there beforehand is all there is.
    assert _checkpoint_objects(stack, request_id) == [checkpoint_key("acme", request_id, 1)]


def test_a_resume_sent_for_a_task_that_keeps_no_session_is_refused_at_receive(
    stack: Stack,
) -> None:
    # A sender that skipped the client (straight to SQS, an event): recorded failed as
    # validation, the message removed, nothing locked or run.
    parts = worker_parts(stack)
    _, message, entry = send_and_receive(stack, "sample-echo", resume=True)
    parts.inflight.add(entry)
    verdict = parts.handler.prepare(message, entry)
    assert parts.batcher.flush()

    assert isinstance(verdict, str)
    (failed,) = parts.sink.of("Task Failed")
    error = failed.payload["error"]
    assert error["category"] == "validation"
    assert "only an agent task keeps a session to resume" in error["message"]
    assert not parts.sink.of("Task Processing Started")
    left = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=0)
    assert not left.get("Messages")
