"""dlq-processor: a dead letter whose task has attempts left goes back to the task queue.

SQS counts receives, not attempts (a killed worker's prefetch, a lost receive answer);
the processor returns such a task a bounded number of times instead of failing it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from dlq_support import dead_letter, dlq_event, envelope_of, spend_receives, tasks_of
from support import wait_for

from agentq.config import Settings
from agentq.dlq import DLQ_REASON, DlqArchive
from agentq.dlq.returns import MAX_DLQ_RETURNS
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.local.lambda_host import LambdaHost, local_context
from agentq.local.workers import WorkerProcess, fast_env
from agentq.states import TaskState
from agentq.store import EventStore
from lambdas import dlq_processor

pytestmark = pytest.mark.timeout(180)


def _settle(stack: Stack, event: dict[str, Any]) -> None:
    """The Lambda service's part: call the handler, delete what succeeded."""
    assert dlq_processor.handler(event, local_context("dlq")) == {"batchItemFailures": []}
    for record in event["Records"]:
        stack.sqs.delete_message(
            QueueUrl=stack.resources.dlq_url, ReceiptHandle=record["receiptHandle"]
        )


def test_a_dead_letter_with_attempts_left_is_returned_with_its_attributes(stack: Stack) -> None:
    envelope = envelope_of("r-ret-1")
    dead_letter(stack, envelope, crash=False)  # three receives, no attempt
    _settle(stack, dlq_event(stack))

    record = tasks_of(stack).require("acme", "r-ret-1")
    assert (record.state, record.attempt, record.raw["dlqReturns"]) == (TaskState.PENDING, 0, 1)
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "returned"
    (copy,) = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, MessageAttributeNames=["All"], WaitTimeSeconds=2
    )["Messages"]
    assert json.loads(copy["Body"]) == envelope.to_dict()
    assert copy["MessageAttributes"]["requestId"]["StringValue"] == "r-ret-1"
    assert copy["MessageId"] != archived.message_id


def test_a_task_returned_as_often_as_the_bound_allows_then_fails(stack: Stack) -> None:
    """A message no worker settles (here: received and dropped, over and over) still
    ends: after MAX_DLQ_RETURNS returns its next dead letter fails the task as before."""
    envelope = envelope_of("r-ret-bound")
    dead_letter(stack, envelope, crash=False)
    for returns in range(1, MAX_DLQ_RETURNS + 1):
        _settle(stack, dlq_event(stack))
        record = tasks_of(stack).require("acme", "r-ret-bound")
        assert (record.state, record.raw["dlqReturns"]) == (TaskState.PENDING, returns)
        spend_receives(stack, envelope)
    _settle(stack, dlq_event(stack))

    record = tasks_of(stack).require("acme", "r-ret-bound")
    assert record.state is TaskState.FAILED
    assert record.raw["error"]["message"] == DLQ_REASON
    outcomes = sorted(m.outcome for m in DlqArchive(stack.s3, stack.resources.bucket).list())
    assert outcomes == ["failed"] + ["returned"] * MAX_DLQ_RETURNS


def test_a_task_out_of_attempts_is_not_returned(stack: Stack) -> None:
    envelope = envelope_of("r-ret-spent")
    dead_letter(stack, envelope, crash=True)  # three crashed attempts of three
    _settle(stack, dlq_event(stack))
    record = tasks_of(stack).require("acme", "r-ret-spent")
    assert (record.state, record.attempt) == (TaskState.FAILED, 3)
    assert "dlqReturns" not in record.raw
    assert (
        stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=0).get(
            "Messages", []
        )
        == []
    )


def test_a_dead_lettered_scheduled_task_is_returned_keeping_its_time(stack: Stack) -> None:
    """A delayed task waits as SCHEDULED and its message is re-delayed receive after
    receive: its dead letter has every attempt left and goes back, not to FAILED."""
    not_before = now_ms() + 3_600_000
    envelope = replace(envelope_of("r-ret-later"), not_before_ms=not_before)
    tasks_of(stack).create(envelope, state=TaskState.SCHEDULED)
    dead_letter(stack, envelope, crash=False, create=False)
    _settle(stack, dlq_event(stack))

    record = tasks_of(stack).require("acme", "r-ret-later")
    assert (record.state, record.attempt, record.raw["dlqReturns"]) == (
        TaskState.SCHEDULED, 0, 1)  # fmt: skip
    assert record.raw["notBefore"] == not_before
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "returned"
    (copy,) = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, MessageAttributeNames=["All"], WaitTimeSeconds=2
    )["Messages"]
    assert json.loads(copy["Body"])["notBefore"] == not_before


@pytest.mark.e2e
def test_a_returned_task_runs_to_completion_on_a_worker(stack: Stack, tmp_path: Path) -> None:
    envelope = TaskEnvelope(request_id="r-ret-run", tenant="acme", definition="sample-echo",
                            input={"text": "back"})  # fmt: skip
    dead_letter(stack, envelope, crash=False)
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    worker = WorkerProcess("return-worker", log_dir=tmp_path)
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0):
        worker.start({**stack.env(), **fast_env()})
        try:
            record = wait_for(
                lambda: (r := tasks_of(stack).require("acme", "r-ret-run")).state.terminal and r,
                timeout=90, message="the returned task finished",
            )  # fmt: skip
            wait_for(
                lambda: [e for e in events.timeline("acme", "r-ret-run")
                         if e["detailType"] == "Task Completed"],
                timeout=60, message="Task Completed in the table",
            )  # fmt: skip
        finally:
            worker.stop(timeout=30)

    assert record.state is TaskState.COMPLETED, worker.output()[-3000:]
    assert (record.attempt, record.raw["dlqReturns"]) == (1, 1)
    kinds = [e["detailType"] for e in events.timeline("acme", "r-ret-run")]
    assert kinds.count("Task Completed") == 1 and "Task Failed" not in kinds
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "returned"
