"""A worker pointed at something that does not exist exits at start-up, saying what to fix."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import Stack
from security_support import launched_worker

from worker.receive.consumer import ExitCode

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
    env = {variable: value.format(endpoint=endpoint)}
    with launched_worker(stack, f"preflight-{variable.lower()}", env) as worker:
        assert worker.wait(timeout=120) == ExitCode.CONFIG
    lines = worker.output().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"agentq worker: configuration: {variable} = ")
    assert "names nothing that exists" in lines[0] and "set it to" in lines[0]


def test_an_unreachable_endpoint_stops_the_worker_naming_what_to_check(stack: Stack) -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    unreachable = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    with launched_worker(stack, "preflight-unreachable", unreachable) as worker:
        assert worker.wait(timeout=150) == ExitCode.CONFIG
    (line,) = worker.output().strip().splitlines()
    assert line.startswith("agentq worker: configuration: SQS_QUEUE_URL = ")
    assert "AWS_ENDPOINT_URL" in line


class Denying(BaseHTTPRequestHandler):
    """An AWS endpoint whose IAM allows nothing: every JSON-protocol call is denied."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"__type": "AccessDeniedException",
                           "message": "not authorized to perform this action"}).encode()  # fmt: skip
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def denying_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Denying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_denied_bus_check_stops_the_worker(stack: Stack, denying_endpoint: str) -> None:
    """The worker's role holds events:DescribeEventBus on its own bus: a denial means
    another stage's bus, not a start-up check the role may not make."""
    denied = {"AWS_ENDPOINT_URL_EVENTBRIDGE": denying_endpoint}
    with launched_worker(stack, "preflight-denied-bus", denied) as worker:
        assert worker.wait(timeout=120) == ExitCode.CONFIG
    (line,) = worker.output().strip().splitlines()
    assert line.startswith("agentq worker: configuration: EVENTBRIDGE_BUS_NAME = ")
    assert "is not allowed for these credentials (AccessDeniedException)" in line


def test_a_denied_table_check_stops_the_worker(stack: Stack, denying_endpoint: str) -> None:
    """The worker's role holds GetItem on its table: a denial means the wrong table."""
    denied = {"AWS_ENDPOINT_URL_DYNAMODB": denying_endpoint}
    with launched_worker(stack, "preflight-denied-table", denied) as worker:
        assert worker.wait(timeout=120) == ExitCode.CONFIG
    (line,) = worker.output().strip().splitlines()
    assert line.startswith("agentq worker: configuration: DYNAMODB_EVENTS_TABLE_NAME = ")
    assert "is not allowed for these credentials (AccessDeniedException)" in line
