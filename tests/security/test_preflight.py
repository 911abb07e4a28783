"""A worker pointed at something that does not exist exits at start-up, saying what to fix."""

from __future__ import annotations

import pytest
from conftest import Stack

from agentq.local.workers import WorkerProcess, fast_env
from worker.consumer import ExitCode

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SQS_QUEUE_URL", "{endpoint}/123456789012/no-such-queue"),
        ("DYNAMODB_EVENTS_TABLE_NAME", "no-such-table"),
        ("EVENTBRIDGE_BUS_NAME", "no-such-bus"),
        ("S3_BUCKET", "no-such-bucket-agentq"),
    ],
)
def test_a_missing_resource_stops_the_worker_with_one_line_naming_it(
    stack: Stack, variable: str, value: str
) -> None:
    endpoint = stack.env().get("AWS_ENDPOINT_URL", "")
    worker = WorkerProcess(f"preflight-{variable.lower()}")
    worker.start({**stack.env(), **fast_env(), variable: value.format(endpoint=endpoint)})
    try:
        assert worker.wait(timeout=120) == ExitCode.CONFIG
    finally:
        worker.kill()
    lines = worker.output().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"agentq worker: configuration: {variable} = ")
    assert "names nothing that exists" in lines[0] and "set it to" in lines[0]


def test_an_unreachable_endpoint_stops_the_worker_naming_what_to_check(stack: Stack) -> None:
    worker = WorkerProcess("preflight-unreachable")
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    worker.start({**stack.env(), **fast_env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    try:
        assert worker.wait(timeout=150) == ExitCode.CONFIG
    finally:
        worker.kill()
    (line,) = worker.output().strip().splitlines()
    assert line.startswith("agentq worker: configuration: SQS_QUEUE_URL = ")
    assert "AWS_ENDPOINT_URL" in line
