"""Tasks of every producer path are listed: a raw SQS message (no `Task Pending`, its
first event is its worker's) and a message the worker rejected (no STATE item) appear in
`agentq watch`'s recent tasks and on the console's Tasks page."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack
from support import store_events, wait_for
from worker_support import queue_counts, running_worker, send

from agentq.client import AgentqClient
from agentq.console.standalone import StandaloneTasks
from agentq.events import now_ms

pytestmark = pytest.mark.timeout(120)


def test_raw_sqs_and_rejected_messages_are_listed_with_their_state(stack: Stack) -> None:
    stored: list[dict[str, Any]] = []  # the save-event Lambda's work, played here

    def seen(request_id: str, detail_type: str) -> bool:
        stored.extend(store_events(stack))
        return any(e["requestId"] == request_id and e["detail-type"] == detail_type
                   for e in stored)  # fmt: skip

    started = now_ms() - 1000
    with running_worker(stack):
        raw = send(stack, "sample-echo", {"hello": "raw"})
        stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody="{not json",
                               MessageAttributes={"requestId": {"DataType": "String",
                                                                "StringValue": "raw-bad-1"}})  # fmt: skip
        wait_for(lambda: seen(raw.request_id, "Task Completed"), message="the raw task done")
        wait_for(lambda: seen("raw-bad-1", "Task Failed"), message="the bad message rejected")
        wait_for(lambda: queue_counts(stack) == (0, 0), message="both messages settled")
    client = AgentqClient.from_env()
    recent = {r.request_id: r.state.value for r in client.recent_tasks(since_ms=started,
                                                                          tenant="acme")}  # fmt: skip
    assert recent.get(raw.request_id) == "COMPLETED", recent
    page = StandaloneTasks(client).page("acme")
    listed = {row["requestId"]: row["state"] for row in page["tasks"]}
    assert listed.get(raw.request_id) == "COMPLETED", listed
    # A body that names no tenant is recorded under the worker's default one.
    (failed,) = [e for e in stored if e["requestId"] == "raw-bad-1"]
    rows = StandaloneTasks(client).page(failed["tenant"])["tasks"]
    assert {r["requestId"]: r["state"] for r in rows}.get("raw-bad-1") == "FAILED", rows
