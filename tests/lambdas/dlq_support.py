"""Dead letters made the way SQS makes them: receives spent until the message moves."""

from __future__ import annotations

from typing import Any

from conftest import Stack
from support import wait_for

from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.local.lambda_host import sqs_lambda_record
from agentq.store import TaskStore


def envelope_of(request_id: str) -> TaskEnvelope:
    return TaskEnvelope(request_id=request_id, tenant="acme", definition="echo",
                        input={"text": "hi"})  # fmt: skip


def tasks_of(stack: Stack) -> TaskStore:
    return TaskStore(stack.dynamodb, stack.resources.table_name)


def send(stack: Stack, envelope: TaskEnvelope) -> None:
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )


def crashed_attempt(tasks: TaskStore, envelope: TaskEnvelope) -> None:
    """A worker locks the task and dies: its short lease simply runs out. Three of them
    spend the task's whole budget (3), so its dead letter is failed, not returned."""
    lease = tasks.acquire(envelope, worker_id="w-dead", lease_seconds=0.05, max_attempts=3)
    wait_for(lambda: now_ms() > lease.effective_until_ms, timeout=5, message="lease expiry")


def dead_letter(
    stack: Stack, envelope: TaskEnvelope, *, crash: bool = True, create: bool = True
) -> None:
    """Receive the message three times without deleting it; SQS then moves it to the DLQ."""
    if create:
        tasks_of(stack).create(envelope)
    send(stack, envelope)
    spend_receives(stack, envelope, crash=crash)


def spend_receives(stack: Stack, envelope: TaskEnvelope, *, crash: bool = False) -> None:
    """The one message on the task queue received until SQS moves it to the DLQ (with a
    crashed attempt per receive when `crash`, else as a killed worker's prefetch)."""
    tasks = tasks_of(stack)
    for _ in range(3):
        got = stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, VisibilityTimeout=0, WaitTimeSeconds=5
        ).get("Messages", [])
        assert len(got) == 1
        if crash:
            crashed_attempt(tasks, envelope)

    def moved() -> bool:
        # The receive past maxReceiveCount is what makes SQS move the message.
        stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=0)
        attributes = stack.sqs.get_queue_attributes(
            QueueUrl=stack.resources.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) == 1

    wait_for(moved, timeout=20, message="the message in the DLQ")


def dlq_event(stack: Stack) -> dict[str, Any]:
    messages = stack.sqs.receive_message(
        QueueUrl=stack.resources.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=2,
        AttributeNames=["All"], MessageAttributeNames=["All"],
    )["Messages"]  # fmt: skip
    return {"Records": [sqs_lambda_record(m, queue_arn=stack.resources.dlq_arn) for m in messages]}
