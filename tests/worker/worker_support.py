"""Helpers of the worker tests: sending tasks, watching events, reading STATE items."""

from __future__ import annotations

import json
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
    stack: Stack, definition: str, payload: dict[str, Any] | None = None, *, request_id: str = ""
) -> TaskEnvelope:
    envelope = TaskEnvelope(
        request_id=request_id or new_id(),
        tenant="acme",
        definition=definition,
        input=payload or {},
    )
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )
    return envelope


class EventLog:
    """Every event the bus got, read from the save-event rule's target queue."""

    def __init__(self, stack: Stack) -> None:
        self._sqs = stack.sqs
        self._url = stack.resources.target_queues["save-event"]
        self.events: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        while True:
            response = self._sqs.receive_message(
                QueueUrl=self._url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", [])
            if not messages:
                return self.events
            for message in messages:
                body = json.loads(message["Body"])
                self.events.append({"detail-type": body["detail-type"], **body["detail"]})
            self._sqs.delete_message_batch(
                QueueUrl=self._url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )

    def of(self, request_id: str, detail_type: str | None = None) -> list[dict[str, Any]]:
        self.poll()
        return [
            e
            for e in self.events
            if e.get("requestId") == request_id
            and (detail_type is None or e["detail-type"] == detail_type)
        ]

    def types(self, request_id: str) -> list[str]:
        return [e["detail-type"] for e in self.of(request_id)]

    def wait(
        self, request_id: str, detail_type: str, *, count: int = 1, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        return wait_for(
            lambda: (found := self.of(request_id, detail_type)) and len(found) >= count and found,
            timeout=timeout,
            interval=0.1,
            message=f"{count}x {detail_type} for {request_id}",
        )


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
