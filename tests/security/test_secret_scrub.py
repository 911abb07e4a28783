"""The worker's own secrets reach none of its sinks.

Secret values are planted in the worker's environment (under the names that mark
them), then tasks print their environment, fail with the secrets in the error, echo them
as their result, and messages carry them in invalid fields. Every sink is then grepped:
the worker's log output, the events EventBridge delivered, the whole table (events,
STATE items' error records) and every object in the bucket.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for

from agentq.local.workers import WorkerProcess, fast_env

pytestmark = pytest.mark.timeout(240)


def _planted(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


PLANTED = {
    "ANTHROPIC_API_KEY": _planted("planted-anthropic"),
    "CLAUDE_CODE_OAUTH_TOKEN": _planted("planted-oauth"),
    # 40 characters with a slash, like a real one: not a valid tenant, quoted back whole.
    "AWS_SECRET_ACCESS_KEY": "PLANTED/" + uuid.uuid4().hex,
    "AWS_SESSION_TOKEN": _planted("planted-session"),
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": f"/v2/credentials/{uuid.uuid4()}",
    "SLACK_BOT_TOKEN": _planted("planted-slack"),
    "AGENTQ_DB_PASSWORD": _planted("planted-db"),
}
AWS_SECRET = PLANTED["AWS_SECRET_ACCESS_KEY"]


def _send(stack: Stack, body: dict[str, Any], request_id: str) -> None:
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=json.dumps(body),
        MessageAttributes={"requestId": {"DataType": "String", "StringValue": request_id}},
    )


def _table_text(stack: Stack) -> str:
    """Every item of the table, but a STATE item's envelope (the producer's own input,
    kept for recovery: what it sent is its business)."""
    items: list[dict[str, Any]] = []
    paginator = stack.dynamodb.get_paginator("scan")
    for page in paginator.paginate(TableName=stack.resources.table_name):
        items.extend({k: v for k, v in item.items() if k != "envelope"} for item in page["Items"])
    return json.dumps(items)


def _bucket(stack: Stack) -> Iterator[tuple[str, str]]:
    listing = stack.s3.list_objects_v2(Bucket=stack.resources.bucket)
    for obj in listing.get("Contents", []):
        body = stack.s3.get_object(Bucket=stack.resources.bucket, Key=obj["Key"])["Body"]
        yield obj["Key"], body.read().decode(errors="replace")


def test_planted_worker_secrets_reach_no_sink(stack: Stack) -> None:
    events = EventLog(stack)
    every = " ".join(PLANTED.values())
    worker = WorkerProcess("scrub").start({**stack.env(), **fast_env(), **PLANTED})
    try:
        printer, failer, echo = (f"s-{uuid.uuid4().hex[:10]}" for _ in range(3))
        invalid = f"s-{uuid.uuid4().hex[:10]}"
        _send(stack, {"requestId": printer, "tenant": "acme", "definition": "sample-print-env"},
              printer)  # fmt: skip
        _send(stack, {"requestId": failer, "tenant": "acme", "definition": "sample-fail",
                      "input": {"category": "validation", "message": f"boom {every}"}}, failer)  # fmt: skip
        _send(stack, {"requestId": echo, "tenant": "acme", "definition": "sample-echo",
                      "input": {"text": every}}, echo)  # fmt: skip
        # An invalid field that happens to equal the worker's AWS secret.
        _send(stack, {"requestId": invalid, "tenant": AWS_SECRET, "definition": "sample-noop"},
              invalid)  # fmt: skip
        for request_id, ending in ((printer, "Task Completed"), (failer, "Task Failed"),
                                   (echo, "Task Completed"), (invalid, "Task Failed")):  # fmt: skip
            events.wait(request_id, ending, timeout=90)
        wait_for(lambda: "[REDACTED]" in worker.output(), message="a scrubbed log line")
        worker.stop(timeout=60)
    finally:
        worker.kill()

    log = worker.output()
    # The secrets did travel: the child printed its own, the errors quoted them.
    assert f"[task:{printer}] ANTHROPIC_API_KEY=[REDACTED]" in log
    rejected = events.of(invalid, "Task Failed")[0]["payload"]["error"]["message"]
    assert rejected.startswith("tenant: must match") and "[REDACTED]" in rejected, rejected
    sinks = {
        "worker log": log,
        "events": "\n".join(events.raw),
        "table": _table_text(stack),
        **{f"s3 {key}": text for key, text in _bucket(stack)},
    }
    assert any(name.endswith("error.json") for name in sinks), sorted(sinks)
    assert any("task-result" in name or "result" in name for name in sinks), sorted(sinks)
    for name, value in PLANTED.items():
        leaked = [sink for sink, text in sinks.items() if value in text]
        assert not leaked, f"{name} reached {leaked}"
