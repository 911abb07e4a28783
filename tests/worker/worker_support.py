"""Helpers of the worker tests: sending tasks, watching events, reading STATE items."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conftest import Stack
from support import wait_for

from agentq.envelope import TaskEnvelope
from agentq.local.workers import WorkerProcess, fast_env
from agentq.store.tasks import TaskRecord, TaskStore


def new_id(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def send(
    stack: Stack,
    definition: str,
    payload: dict[str, Any] | None = None,
    *,
    request_id: str = "",
    priority: str | None = None,
) -> TaskEnvelope:
    """One task as every agentq producer sends it: to its priority tier's queue, or the
    task queue when it names none."""
    envelope = TaskEnvelope(
        request_id=request_id or new_id(priority or "r"),
        tenant="acme",
        definition=definition,
        input=payload or {},
        priority=priority,
    )
    stack.sqs.send_message(
        QueueUrl=stack.resources.tier_queues[priority] if priority else stack.resources.queue_url,
        MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )
    return envelope


def store(stack: Stack) -> TaskStore:
    return TaskStore(stack.dynamodb, stack.resources.table_name)


def state(stack: Stack, envelope: TaskEnvelope) -> TaskRecord | None:
    return store(stack).get(envelope.tenant, envelope.request_id)


def queue_counts(stack: Stack, url: str | None = None) -> tuple[int, int]:
    """(visible, in flight) messages of the task queue (or another queue)."""
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=url or stack.resources.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def receive_all(stack: Stack, count: int) -> list[dict[str, Any]]:
    """At least `count` messages of the task queue, received (and hidden) for 300 s."""
    got: list[dict[str, Any]] = []

    def received() -> bool:
        reply = stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=300
        )
        got.extend(reply.get("Messages", []))
        return len(got) >= count

    wait_for(received, timeout=30, message=f"{count} messages received")
    return got


def set_visibility_timeout(stack: Stack, seconds: int) -> None:
    stack.sqs.set_queue_attributes(
        QueueUrl=stack.resources.queue_url, Attributes={"VisibilityTimeout": str(seconds)}
    )


@contextmanager
def running_worker(stack: Stack, name: str = "w1", **overrides: str) -> Iterator[WorkerProcess]:
    """A real worker process against the stack; killed (with its children) at exit."""
    worker = WorkerProcess(name)
    worker.start({**stack.env(), **fast_env(**overrides)})
    try:
        yield worker
    except BaseException:
        # Shown by pytest with the failure: what the worker saw.
        print(f"--- {name} output ---\n{worker.output()[-6000:]}")
        raise
    finally:
        if worker.alive():
            worker.kill()
