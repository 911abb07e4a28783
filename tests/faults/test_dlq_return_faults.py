"""Returning a dead letter with attempts left under AWS faults: counted once, sent."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import drain_bodies, faulty_client, injector, rule
from support import wait_for

from agentq.config import Settings
from agentq.dlq import DeadLetter, DlqArchive, DlqProcessor, DlqReturner
from agentq.envelope import TaskEnvelope
from agentq.faults.config import Kind
from agentq.faults.injector import FaultInjector
from agentq.publisher import EventPublisher
from agentq.resources import TASK_QUEUE
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


def _dead_letters(stack: Stack) -> list[DeadLetter]:
    """Every message now in the DLQ, as the DLQ processor's Lambda gets them."""
    letters: list[DeadLetter] = []
    while messages := stack.sqs.receive_message(
        QueueUrl=stack.resources.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
        AttributeNames=["All"], MessageAttributeNames=["All"],
    ).get("Messages", []):  # fmt: skip
        for message in messages:
            letters.append(DeadLetter.from_sqs_message(message))
            stack.sqs.delete_message(QueueUrl=stack.resources.dlq_url,
                                     ReceiptHandle=message["ReceiptHandle"])  # fmt: skip
    return letters


def test_copies_of_one_message_dead_lettered_together_spend_one_return(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four copies of one task's message dead-lettered in one burst (a send-back whose
    delete failed, a reconciler's re-send): one goes back and the older copies are
    superseded by it, so the task keeps its attempts instead of ending FAILED once its
    three returns are spent. The returned copy dying in its turn is the next return."""
    # This test's copies are milliseconds older than the return, not a second.
    monkeypatch.setattr("agentq.dlq.returns.OLDER_COPY_MARGIN_MS", 0)
    envelope, letter = _letter(stack)
    for _ in range(4):
        stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody=letter.body,
                               MessageAttributes=letter.attributes)  # fmt: skip
    processor = _processor(stack, dynamodb=stack.dynamodb, sqs=stack.sqs)

    outcomes = [processor.process(copy) for copy in _dead_letters(stack)]

    assert [o.outcome for o in outcomes] == ["returned"] * 4, [o.detail for o in outcomes]
    assert sum("superseded" in (o.detail or "") for o in outcomes) == 3
    assert _returns(stack, envelope) == (TaskState.PENDING, 1)
    (returned,) = drain_bodies(stack, stack.resources.queue_url)
    # The returned copy, received until it too is dead-lettered: a return of its own.
    stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody=json.dumps(returned),
                           MessageAttributes=letter.attributes)  # fmt: skip
    (again,) = [processor.process(copy) for copy in _dead_letters(stack)]
    assert again.outcome == "returned" and "superseded" not in (again.detail or "")
    assert _returns(stack, envelope) == (TaskState.PENDING, 2)


def test_a_dead_letter_keeps_the_sent_time_of_its_first_send(stack: Stack) -> None:
    """What telling older copies apart relies on (AWS: "when a message is moved to a
    dead-letter queue, the enqueue timestamp is unchanged"), through the stage's own
    redrive policy."""
    sqs, queue = stack.sqs, stack.resources.queue_url
    drain_bodies(stack, queue)
    sqs.send_message(QueueUrl=queue, MessageBody="{}")
    first = None
    for _ in range(TASK_QUEUE.max_receive_count):
        [message] = wait_for(lambda: sqs.receive_message(
            QueueUrl=queue, VisibilityTimeout=0, AttributeNames=["All"]).get("Messages"),
            timeout=30, message="the message, visible again")  # fmt: skip
        first = first or message["Attributes"]["SentTimestamp"]
    (letter,) = wait_for(lambda: _dead_letters(stack) if _moved(stack) else None,
                         timeout=30, message="the message in the DLQ")  # fmt: skip
    assert letter.system_attributes["SentTimestamp"] == first


def _moved(stack: Stack) -> bool:
    # A receive past maxReceiveCount is what moves it (as on AWS).
    stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=0)
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) > 0
