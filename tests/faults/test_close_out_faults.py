"""Terminal events and job dispatch under AWS faults (issue 14, defects 2 and 3)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import (
    acquire_as_worker,
    dispatch_a_completed,
    drain_bodies,
    faulty_client,
    injector,
    job_with_a_completed,
    rule,
    unique_seed,
)

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.dlq import DeadLetter, DlqArchive, DlqProcessor
from agentq.envelope import TaskEnvelope
from agentq.events import task_event
from agentq.faults.config import Kind
from agentq.faults.log import read_counts
from agentq.jobs import task_request_id
from agentq.jobs.store import JobStore
from agentq.publisher import EventPublisher, PublishError
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from lambdas import dispatcher

pytestmark = pytest.mark.timeout(120)


def _processor(stack: Stack, events_client: Any) -> DlqProcessor:
    settings = Settings.from_env()
    return DlqProcessor(
        tasks=TaskStore(stack.dynamodb, stack.resources.table_name),
        archive=DlqArchive(stack.s3, stack.resources.bucket),
        publisher=EventPublisher(
            events_client,
            bus_name=stack.resources.bus_name,
            source=settings.app_name,
            max_attempts=2,
            sleep=lambda _: None,
        ),
        default_tenant=settings.tenant_id,
    )


def _bus_events(stack: Stack, request_id: str, detail_type: str) -> list[dict[str, Any]]:
    bodies = drain_bodies(stack, stack.resources.target_queues["save-event"])
    return [
        b["detail"]
        for b in bodies
        if b["detail-type"] == detail_type and b["detail"].get("requestId") == request_id
    ]


def test_dlq_close_out_whose_publish_failed_is_published_by_the_retry(stack: Stack) -> None:
    """Defect 2: FAILED was written without its terminal event; when PutEvents failed,
    the retried invocation found the task terminal with nothing to re-send."""
    envelope = TaskEnvelope(
        request_id=f"d-{uuid.uuid4().hex[:12]}", tenant="acme", definition="echo", input={}
    )
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    tasks.create(envelope)
    letter = DeadLetter(
        message_id=uuid.uuid4().hex,
        body=envelope.to_body(),
        attributes=envelope.message_attributes(),
    )
    failing = faulty_client(stack, "events", injector(rule("events:PutEvents", Kind.PARTIAL_BATCH)))
    with pytest.raises(PublishError):
        _processor(stack, failing).process(letter)
    assert tasks.require(envelope.tenant, envelope.request_id).state is TaskState.FAILED

    retried = _processor(stack, stack.events).process(letter)  # the Lambda's retry
    assert retried.outcome == "already-terminal"
    [event] = _bus_events(stack, envelope.request_id, "Task Failed")
    stored = tasks.require(envelope.tenant, envelope.request_id).raw["terminalEvent"]
    assert event["eventId"] == stored["eventId"]


def test_dispatch_whose_unblocking_write_was_applied_then_retried_still_sends(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defect 3: BLOCKED→PENDING applied, botocore's retry failed its condition, and the
    dispatcher assumed another invocation would send: B stayed PENDING with no message."""
    job_id, tasks = job_with_a_completed(stack, ("B",))

    monkeypatch.setenv(
        "AGENTQ_FAULTS",
        json.dumps(
            {
                "rules": [
                    {
                        "op": "dynamodb:UpdateItem",
                        "kind": "applied_then_failed",
                        "rate": 1,
                        "limit": 1,
                        "match": "enqueuedBy",
                    }
                ]
            }
        ),
    )
    monkeypatch.setenv("AGENTQ_FAULTS_SEED", unique_seed())
    monkeypatch.setenv("AGENTQ_FAULTS_LOG", str(tmp_path / "faults.jsonl"))
    dispatch_a_completed(job_id)
    assert read_counts(str(tmp_path / "faults.jsonl")) == {
        "dynamodb:UpdateItem:applied_then_failed": 1
    }
    sent = drain_bodies(stack, stack.resources.queue_url)
    assert [b["taskKey"] for b in sent] == ["B"]
    assert tasks.require("default", task_request_id(job_id, "B")).state is TaskState.PENDING


def test_a_job_whose_last_count_was_applied_then_retried_still_closes(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Same class as defect 3: the job counter's retry found the task counted already,
    the dispatcher kept its stale copy of the job, saw it unfinished and never closed it."""
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    table.put(TaskDefinition(name="noop", kind="python"))
    job_id = f"j{uuid.uuid4().hex[:10]}"
    AgentqClient.from_env().create_job({"tasks": {"A": {"definition": "noop"}}}, job_id=job_id)
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    a_id = task_request_id(job_id, "A")
    lease = acquire_as_worker(tasks, a_id)
    tasks.finalize(lease, TaskState.FAILED)

    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv(
        "AGENTQ_FAULTS",
        json.dumps({"rules": [{"op": "dynamodb:UpdateItem", "kind": "applied_then_failed",
                               "rate": 1, "limit": 1, "match": "countedTasks"}]}),
    )  # fmt: skip
    monkeypatch.setenv("AGENTQ_FAULTS_SEED", unique_seed())
    monkeypatch.setenv("AGENTQ_FAULTS_LOG", str(log))
    event = task_event("Task Failed", request_id=a_id, tenant="default", job_id=job_id, attempt=1)
    dispatcher.handler(
        {"version": "0", "id": event.event_id, "detail-type": event.detail_type,
         "source": "agentq", "time": event.timestamp, "detail": event.to_detail()},
        None,
    )  # fmt: skip
    assert read_counts(str(log)) == {"dynamodb:UpdateItem:applied_then_failed": 1}
    job = JobStore(stack.dynamodb, stack.resources.table_name).get("default", job_id)
    assert job is not None and job.state == "FAILED"


def test_a_cancel_by_policy_whose_publish_failed_is_published_by_the_retry(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The class of defect 2 in the dispatcher: A failed under fail_fast, the dispatcher
    cancelled B and its PutEvents failed for good; the retried event found B CANCELLED
    and sent nothing, so B's ending was never stored as an event."""
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    table.put(TaskDefinition(name="noop", kind="python"))
    job_id = f"j{uuid.uuid4().hex[:10]}"
    spec = {
        "failure_policy": "fail_fast",
        "tasks": {"A": {"definition": "noop"}, "B": {"definition": "noop", "depends_on": ["A"]}},
    }
    AgentqClient.from_env().create_job(spec, job_id=job_id)
    drain_bodies(stack, stack.resources.queue_url)
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    a_id, b_id = task_request_id(job_id, "A"), task_request_id(job_id, "B")
    record = tasks.require("default", a_id)
    lease = tasks.acquire(
        TaskEnvelope.from_dict(dict(record.envelope or {}), default_tenant="default"),
        worker_id="w1", lease_seconds=60, max_attempts=3,
    )  # fmt: skip
    tasks.finalize(lease, TaskState.FAILED, fields={"error": {"category": "task_error"}})
    drain_bodies(stack, stack.resources.target_queues["save-event"])
    # Every try of the cancel's PutEvents fails (the first and botocore's five retries),
    # then none.
    faults = injector(rule("events:PutEvents", Kind.SERVER_ERROR, limit=6, match="Task Cancelled"))
    client = AgentqClient(settings=Settings.from_env(), sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=faulty_client(stack, "events", faults), s3=stack.s3)  # fmt: skip
    event = task_event("Task Failed", request_id=a_id, tenant="default", job_id=job_id, attempt=1)

    with pytest.raises(ClientError, match="PutEvents"):
        client.dispatcher.on_task_event(event)
    assert tasks.require("default", b_id).state is TaskState.CANCELLED
    assert _bus_events(stack, b_id, "Task Cancelled") == []
    client.dispatcher.on_task_event(event)  # the Lambda service's retry of the same event

    assert faults.counts() == {"events:PutEvents:server_error": 6}
    [cancelled] = _bus_events(stack, b_id, "Task Cancelled")
    stored = tasks.require("default", b_id).raw["terminalEvent"]
    assert cancelled["eventId"] == stored["eventId"] and cancelled["jobId"] == job_id
    assert (
        JobStore(stack.dynamodb, stack.resources.table_name).require("default", job_id).state
        == "FAILED"
    )
