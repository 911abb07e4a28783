"""Putting a task on the queue: STATE item, `Task Pending`, SQS message — in that order.

The STATE item is written first and conditionally, so a repeated submit (same request
id, e.g. from the same idempotency key) sends nothing twice. After the message is
sent the item gets `sentAt`; a task found PENDING without it was interrupted between
the two steps and is sent again (a duplicate message is harmless: the worker's lock
runs a task once).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from typing import Any

from botocore.exceptions import ClientError

from agentq.envelope import TaskEnvelope
from agentq.events import now_ms, task_event
from agentq.publisher import EventPublisher
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore, keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values

logger = logging.getLogger(__name__)


def request_id_for(tenant: str, idempotency_key: str | None) -> str:
    """A fresh id, or one derived from the key (per tenant) so the same key maps to one task."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    digest = hashlib.blake2b(f"{tenant}\0{idempotency_key}".encode(), digest_size=16)
    return f"idem-{digest.hexdigest()}"


class TaskSubmitter:
    """Clients are passed in; used by the client, the dispatcher and the producer API."""

    def __init__(
        self,
        *,
        tasks: TaskStore,
        publisher: EventPublisher,
        sqs: Any,
        queue_url: str,
        dynamodb: Any,
        table_name: str,
    ) -> None:
        self.tasks = tasks
        self._publisher = publisher
        self._sqs = sqs
        self._queue_url = queue_url
        self._ddb = dynamodb
        self._table = table_name

    def submit(
        self,
        envelope: TaskEnvelope,
        *,
        state: TaskState = TaskState.PENDING,
        idempotency_key: str | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Create the task (PENDING: also enqueue it). Returns (record, created)."""
        record, created = self.tasks.create(envelope, state=state, idempotency_key=idempotency_key)
        if created and state is TaskState.PENDING:
            self.enqueue(envelope)
        elif not created and self.interrupted(record):
            logger.warning("re-sending %s: an earlier submit stopped before sending", record)
            self.enqueue(
                TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)
            )
        return record, created

    @staticmethod
    def interrupted(record: TaskRecord) -> bool:
        """PENDING, never sent: a submit or dispatch crashed between its writes."""
        return record.state is TaskState.PENDING and "sentAt" not in record.raw

    def enqueue(self, envelope: TaskEnvelope) -> str:
        """`Task Pending`, then the message; returns the SQS message id."""
        self._publisher.publish(
            task_event(
                "Task Pending",
                request_id=envelope.request_id,
                tenant=envelope.tenant,
                job_id=envelope.job_id,
                definition=envelope.definition,
                task_key=envelope.task_key,
            )
        )
        response = self._sqs.send_message(
            QueueUrl=self._queue_url,
            MessageBody=envelope.to_body(),
            MessageAttributes=envelope.message_attributes(),
        )
        self._mark_sent(envelope)
        return str(response["MessageId"])

    def _mark_sent(self, envelope: TaskEnvelope) -> None:
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={
                    "PK": {"S": keys.task_pk(envelope.tenant, envelope.request_id)},
                    "SK": {"S": keys.STATE_SK},
                },
                UpdateExpression="SET sentAt = :now",
                ConditionExpression="attribute_exists(PK)",
                ExpressionAttributeValues=values(now=now_ms()),
            )
        except ClientError as error:
            if not condition_failed(error):
                raise
