"""Returning a dead letter with attempts left under AWS faults: counted once, sent."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import drain_bodies, faulty_client, injector, rule

from agentq.config import Settings
from agentq.dlq import DeadLetter, DlqArchive, DlqProcessor, DlqReturner
from agentq.envelope import TaskEnvelope
from agentq.faults.config import Kind
from agentq.faults.injector import FaultInjector
from agentq.publisher import EventPublisher
from agentq.states import TaskState
from agentq.store.tasks import TaskStore

pytestmark = pytest.mark.timeout(120)


def _processor(stack: Stack, *, dynamodb: Any, sqs: Any) -> DlqProcessor:
    settings = Settings.from_env()
    return DlqProcessor(
        tasks=TaskStore(stack.dynamodb, stack.resources.table_name),
        archive=DlqArchive(stack.s3, stack.resources.bucket),
        publisher=EventPublisher(
            stack.events, bus_name=stack.resources.bus_name, source=settings.app_name
        ),
        default_tenant=settings.tenant_id,
        returner=DlqReturner(
            dynamodb=dynamodb,
            table_name=stack.resources.table_name,
            sqs=sqs,
            queue_url=stack.resources.queue_url,
        ),
    )


def _letter(stack: Stack) -> tuple[TaskEnvelope, DeadLetter]:
    """A task that never ran (its receives went to a killed worker's prefetch)."""
    envelope = TaskEnvelope(
        request_id=f"d-{uuid.uuid4().hex[:12]}", tenant="acme", definition="echo", input={}
    )
    TaskStore(stack.dynamodb, stack.resources.table_name).create(envelope)
    letter = DeadLetter(
        message_id=uuid.uuid4().hex, body=envelope.to_body(),
        attributes=envelope.message_attributes(),
    )  # fmt: skip
    drain_bodies(stack, stack.resources.queue_url)  # only this test's copies remain
    return envelope, letter


def _returns(stack: Stack, envelope: TaskEnvelope) -> tuple[TaskState, int]:
    record = TaskStore(stack.dynamodb, stack.resources.table_name).require(
        envelope.tenant, envelope.request_id
    )
    return record.state, int(record.raw.get("dlqReturns", 0))


def _faulty(stack: Stack, service: str, faults: FaultInjector) -> Any:
    return faulty_client(stack, service, faults)


def test_a_return_whose_count_was_applied_then_retried_counts_once(stack: Stack) -> None:
    """botocore's retry of the applied dlqReturns write fails its condition (the count
    moved); the mark (the dead letter's MessageId) says it was this write."""
    envelope, letter = _letter(stack)
    faults = injector(rule("dynamodb:UpdateItem", Kind.APPLIED_THEN_FAILED, limit=1,
                           match="dlqReturns"))  # fmt: skip
    ddb = _faulty(stack, "dynamodb", faults)

    result = _processor(stack, dynamodb=ddb, sqs=stack.sqs).process(letter)

    assert result.outcome == "returned", result.detail
    assert faults.counts() == {"dynamodb:UpdateItem:applied_then_failed": 1}
    assert _returns(stack, envelope) == (TaskState.PENDING, 1)
    sent = drain_bodies(stack, stack.resources.queue_url)
    assert sent == [json.loads(letter.body)]


def test_a_return_whose_send_was_lost_sends_once_on_the_redelivery(stack: Stack) -> None:
    """The Lambda dies (here: SendMessage fails) after counting the return: the record
    fails, SQS redelivers the same dead letter, which finds its own mark and sends the
    copy without counting a second return."""
    envelope, letter = _letter(stack)
    down = injector(rule("sqs:SendMessage", Kind.SERVER_ERROR))
    sqs_down = _faulty(stack, "sqs", down)
    with pytest.raises(ClientError):
        _processor(stack, dynamodb=stack.dynamodb, sqs=sqs_down).process(letter)
    assert down.total() >= 1
    assert _returns(stack, envelope) == (TaskState.PENDING, 1)
    assert drain_bodies(stack, stack.resources.queue_url) == []

    redelivered = _processor(stack, dynamodb=stack.dynamodb, sqs=stack.sqs).process(letter)

    assert redelivered.outcome == "returned", redelivered.detail
    assert _returns(stack, envelope) == (TaskState.PENDING, 1)
    assert drain_bodies(stack, stack.resources.queue_url) == [json.loads(letter.body)]
    archived = DlqArchive(stack.s3, stack.resources.bucket).get(redelivered.archive_key)
    assert archived.outcome == "returned"
