"""Producers other than the client: a `Task Requested` event on the bus and a bare SQS
message in the documented wire format both reach the queue as a valid task envelope."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack
from jobs_support import client_for, drain

from agentq.envelope import parse_message
from agentq.errors import InvalidInput
from agentq.events import now_ms
from agentq.jobs import task_request_id
from agentq.schedule import MAX_DELAY_S
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def _received(stack: Stack) -> list[dict[str, Any]]:
    response = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=1,
        MessageAttributeNames=["All"],
    )
    return list(response.get("Messages", []))


def test_jobs_task_requested_event_is_routed_to_the_task_queue(stack: Stack) -> None:
    detail = {"requestId": "from-bus-1", "tenant": "acme", "definition": "summarize",
              "input": {"document": "hello"}}  # fmt: skip
    stack.events.put_events(
        Entries=[{"Source": "agentq", "DetailType": "Task Requested",
                  "Detail": json.dumps(detail), "EventBusName": stack.resources.bus_name}]
    )  # fmt: skip
    [message] = _received(stack)
    envelope = parse_message(
        message["Body"], message.get("MessageAttributes"), default_tenant="default"
    )
    assert (envelope.request_id, envelope.tenant, envelope.definition) == (
        "from-bus-1", "acme", "summarize",
    )  # fmt: skip
    assert envelope.input == {"document": "hello"}


def test_jobs_bare_sqs_message_in_the_wire_format_parses(stack: Stack) -> None:
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=json.dumps({"definition": "summarize", "input": {"n": 1}}),
        MessageAttributes={"requestId": {"DataType": "String", "StringValue": "boto3-only-1"}},
    )
    [message] = _received(stack)
    envelope = parse_message(
        message["Body"], message.get("MessageAttributes"), default_tenant="default"
    )
    assert (envelope.request_id, envelope.tenant, envelope.input) == (
        "boto3-only-1", "default", {"n": 1},
    )  # fmt: skip


def test_jobs_client_submit_idempotency_and_joining_a_job(stack: Stack) -> None:
    client = client_for(stack)
    first = client.submit("summarize", {"document": "a"}, idempotency_key="same")
    second = client.submit("summarize", {"document": "other"}, idempotency_key="same")
    assert first.request_id == second.request_id
    other_tenant = client.submit("summarize", {}, idempotency_key="same", tenant="globex")
    assert other_tenant.request_id != first.request_id  # keys are per tenant
    assert [m["requestId"] for m in drain(stack)] == [first.request_id, other_tenant.request_id]

    client.create_job({"tasks": {"A": {"definition": "noop"}}}, job_id="joinable")
    drain(stack)
    joined = client.submit("summarize", {"x": 1}, job_id="joinable", idempotency_key="late")
    assert joined.job_id == "joinable" and joined.state is TaskState.PENDING
    assert client.submit("summarize", {}, job_id="joinable", idempotency_key="late") == joined
    assert [m["requestId"] for m in drain(stack)] == [joined.request_id]
    assert client.get_job("joinable").total == 2
    assert [a.request_id for a in client.cancel(job_id="joinable")] == [
        "joinable-A",
        joined.request_id,
    ]
    assert client.get_job("joinable").state == "FAILED"


def test_jobs_creating_a_job_again_resumes_it_and_changes_nothing(stack: Stack) -> None:
    client = client_for(stack)
    spec = {"tasks": {"A": {"definition": "noop"}, "B": {"definition": "noop", "depends_on": "A"}}}
    first = client.create_job(spec, job_id="again")
    assert client.create_job(spec, job_id="again").created_at_ms == first.created_at_ms
    assert [m["taskKey"] for m in drain(stack)] == ["A"]  # sent once
    with pytest.raises(InvalidInput, match="already exists with a different spec"):
        client.create_job({"tasks": {"Z": {"definition": "noop"}}}, job_id="again")
    assert client.get_job("again").spec.keys == ["A", "B"]


def test_jobs_a_task_due_more_than_a_year_ahead_is_refused_as_a_single_task_is(
    stack: Stack,
) -> None:
    """The delay promise holds up to a year (agentq.schedule.MAX_DELAY_S): a job's task
    may not ask for more than a submitted task may, at creation or when added."""
    client = client_for(stack)
    far = (now_ms() + (MAX_DELAY_S + 3600) * 1000) / 1000
    near = (now_ms() + (MAX_DELAY_S - 3600) * 1000) / 1000
    with pytest.raises(InvalidInput, match=r"^tasks.A.not_before: is more than a year ahead"):
        client.create_job({"tasks": {"A": {"definition": "noop", "not_before": far}}})
    job = client.create_job({"tasks": {"A": {"definition": "noop", "not_before": near}}})
    assert client.get_task(task_request_id(job.job_id, "A")).state is TaskState.SCHEDULED
    with pytest.raises(InvalidInput, match=r"^tasks.B.not_before: is more than a year ahead"):
        client.add_tasks(job.job_id, {"B": {"definition": "noop", "not_before": far}})
    assert client.get_job(job.job_id).spec.keys == ["A"]


@pytest.mark.parametrize(
    ("size", "priority"),
    [
        (270_000, None),  # the body alone is too large
        (261_900, None),  # the body fits, with its message attributes it does not
        (10, "no-such-tier"),  # no queue to send it to
    ],
)  # fmt: skip
def test_jobs_a_task_that_cannot_be_sent_is_refused_before_it_is_written(
    stack: Stack, size: int, priority: str | None
) -> None:
    client = client_for(stack)
    with pytest.raises(InvalidInput):
        client.submit("summarize", {"document": "x" * size}, idempotency_key="too-big",
                      priority=priority)  # fmt: skip
    assert drain(stack) == []
    # Nothing half-made: a STATE item left PENDING would be what the same key returns
    # (and would never be sent); instead the corrected submit makes the task.
    ok = client.submit("summarize", {"document": "x"}, idempotency_key="too-big")
    assert ok.envelope is not None and ok.envelope["input"] == {"document": "x"}
    assert [m["requestId"] for m in drain(stack)] == [ok.request_id]
