"""What a task wrote as its result or trace is its own output, read back for its
producer (client, CLI) and the console: whatever it holds, the reader names the
problem instead of crashing (a RecursionError was a 500 on every console poll)."""

from __future__ import annotations

import pytest
from conftest import Stack
from jobs_support import client_for, drain, finish

from agentq.console.artifacts import TaskArtifacts
from agentq.errors import InvalidInput
from agentq.jobs import result_key
from agentq.store.keys import attempt_prefix
from agentq.task_outputs import TRACE_FILE

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe not text", b"1" * 5_000],
    ids=["too-deep", "not-utf8", "too-many-digits"],
)
def test_a_result_or_trace_that_is_not_readable_json_is_named_not_crashed_on(
    stack: Stack, body: bytes
) -> None:
    client = client_for(stack)
    client.create_job({"tasks": {"A": {"definition": "noop"}}}, job_id="odd")
    drain(stack)
    finish(stack, "odd", "A")
    bucket = stack.resources.bucket
    stack.s3.put_object(Bucket=bucket, Key=result_key("default", "odd-A", 1), Body=body)
    trace = attempt_prefix("default", "odd-A", 1) + TRACE_FILE
    stack.s3.put_object(Bucket=bucket, Key=trace, Body=body)

    with pytest.raises(InvalidInput, match="result"):
        client.result("odd-A")
    with pytest.raises(InvalidInput, match="trace"):
        client.outputs.trace(client.tasks.require("default", "odd-A"))
    page = TaskArtifacts(stack.s3, client.results, client.outputs).of(
        client.tasks.require("default", "odd-A")
    )
    assert page["result"] is None and "not JSON" in page["resultState"]
    assert page["trace"] is None
