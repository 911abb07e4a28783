"""Helpers for the job tests: play the worker's part without a worker, read the queue."""

from __future__ import annotations

import json
import uuid
from typing import Any

from conftest import Stack

from agentq.client import AgentqClient
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.envelope import TaskEnvelope
from agentq.events import Event, task_event
from agentq.jobs import result_key, task_request_id
from agentq.states import TaskState
from agentq.store import Lease, TaskStore

DEFINITIONS = ("summarize", "write-report", "noop")


def client_for(stack: Stack) -> AgentqClient:
    """The client as a producer builds it: from the environment the stack exported."""
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    for name in DEFINITIONS:
        table.put(TaskDefinition(name=name, kind="python"))
    return AgentqClient.from_env()


def finish(
    stack: Stack,
    job_id: str,
    key: str,
    state: TaskState = TaskState.COMPLETED,
    *,
    result: Any = None,
    tenant: str = "default",
    cost_usd: float = 0.0,
) -> Event:
    """Lock, run and finalize a task the way the worker does; return its terminal event."""
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    request_id = task_request_id(job_id, key)
    record = store.require(tenant, request_id)
    assert record.envelope is not None
    envelope = TaskEnvelope.from_dict(record.envelope, default_tenant=tenant)
    if record.state is TaskState.PROCESSING:  # started earlier (see `start`)
        assert record.lease_token is not None
        lease = Lease(request_id=request_id, tenant=tenant, token=record.lease_token,
                      worker_id="test-worker", attempt=record.attempt,
                      effective_until_ms=int(record.effective_until_ms or 0))  # fmt: skip
    else:
        lease = store.acquire(envelope, worker_id="test-worker", lease_seconds=60, max_attempts=3)
    fields: dict[str, Any] = {"costUsd": cost_usd}
    if state is TaskState.COMPLETED:
        key_name = result_key(tenant, request_id, lease.attempt)
        stack.s3.put_object(
            Bucket=stack.resources.bucket,
            Key=key_name,
            Body=json.dumps(result if result is not None else {"key": key}).encode(),
        )
        fields["result"] = {"bucket": stack.resources.bucket, "key": key_name}
    store.finalize(lease, state, fields=fields)
    kind: Any = {"COMPLETED": "Task Completed", "FAILED": "Task Failed",
                 "TIMEOUT": "Task Timeout"}[state.value]  # fmt: skip
    return task_event(kind, request_id=request_id, tenant=tenant, job_id=job_id, attempt=1)


def start(stack: Stack, job_id: str, key: str, tenant: str = "default") -> None:
    """Lock a task as a worker would when it starts running it (it stays PROCESSING)."""
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    record = store.require(tenant, task_request_id(job_id, key))
    assert record.envelope is not None
    envelope = TaskEnvelope.from_dict(record.envelope, default_tenant=tenant)
    store.acquire(envelope, worker_id="test-worker", lease_seconds=60, max_attempts=3)


def eventbridge(event: Event) -> dict[str, Any]:
    """The envelope EventBridge hands a Lambda target."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": event.detail_type,
        "source": "agentq",
        "account": "123456789012",
        "time": event.timestamp,
        "region": "eu-west-1",
        "resources": [],
        "detail": json.loads(json.dumps(event.to_detail())),
    }


def drain(stack: Stack, queue_url: str | None = None) -> list[dict[str, Any]]:
    """Every message now visible on a queue (deleted as read): what was sent since last time."""
    url = queue_url or stack.resources.queue_url
    seen: list[dict[str, Any]] = []
    while True:
        response = stack.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return seen
        for message in messages:
            body = json.loads(message["Body"])
            body["_attributes"] = {
                k: v.get("StringValue") for k, v in message.get("MessageAttributes", {}).items()
            }
            seen.append(body)
        stack.sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )


def keys_sent(stack: Stack) -> list[str]:
    return sorted(str(body["taskKey"]) for body in drain(stack))


def bus_events(stack: Stack) -> list[dict[str, Any]]:
    """Events that reached the bus since last time (via the save-event rule's queue)."""
    return drain(stack, stack.resources.target_queues["save-event"])


def of_type(events: list[dict[str, Any]], detail_type: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("detail-type") == detail_type]
