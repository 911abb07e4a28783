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
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.envelope import MAX_BODY_BYTES, TaskEnvelope
from agentq.errors import InvalidInput
from agentq.events import event_of, now_ms
from agentq.publisher import EventPublisher
from agentq.schedule import SQS_MAX_DELAY_S, remaining_s
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore, keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values
from agentq.store.idempotent import retry_conflicts

logger = logging.getLogger(__name__)

_MAX_BATCH: Final = 10
# States whose task has a message on the queue (or is about to get one).
_SENT_STATES: Final = frozenset({TaskState.PENDING, TaskState.SCHEDULED})
# Message attributes count towards the batch size; ours are small.
_ATTRIBUTE_ALLOWANCE: Final = 512


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
        max_message_delay_s: int = SQS_MAX_DELAY_S,
        tier_urls: Mapping[str, str] | None = None,
    ) -> None:
        self.tasks = tasks
        self._max_delay_s = max_message_delay_s
        self._publisher = publisher
        self._sqs = sqs
        self._queue_url = queue_url
        # Priority tier → queue; a task without a priority goes to `queue_url`.
        self._tier_urls = dict(tier_urls or {})
        self._ddb = dynamodb
        self._table = table_name

    def queue_for(self, envelope: TaskEnvelope) -> str:
        """The queue of the task's priority tier (InvalidInput for an unknown tier)."""
        if envelope.priority is None:
            return self._queue_url
        url = self._tier_urls.get(envelope.priority)
        if url is None:
            known = ", ".join(self._tier_urls) or "none configured"
            raise InvalidInput("priority", f"unknown priority {envelope.priority!r} ({known})")
        return url

    def submit(
        self,
        envelope: TaskEnvelope,
        *,
        state: TaskState = TaskState.PENDING,
        idempotency_key: str | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Create the task (PENDING: also enqueue it). Returns (record, created).

        A task with a future `not_before_ms` is created SCHEDULED and its message sent
        with a delay (see `enqueue_many`).
        """
        if state is TaskState.PENDING and remaining_s(envelope.not_before_ms, now_ms()) > 0:
            state = TaskState.SCHEDULED
        # What the send would refuse is refused before the task is written: a task
        # stored but unsendable stayed PENDING for good, and its retries failed alike.
        envelope.to_body()
        self.queue_for(envelope)
        record, created = self.tasks.create(envelope, state=state, idempotency_key=idempotency_key)
        if created and state in _SENT_STATES:
            self.enqueue(envelope)
        elif not created and self.interrupted(record):
            logger.warning("re-sending a task an earlier submit stopped before sending",
                           extra={"requestId": record.request_id, "tenant": record.tenant})  # fmt: skip
            self.enqueue(
                TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)
            )
        return record, created

    @staticmethod
    def interrupted(record: TaskRecord) -> bool:
        """PENDING, never sent: a submit or dispatch crashed between its writes."""
        return record.state in _SENT_STATES and "sentAt" not in record.raw

    def enqueue(self, envelope: TaskEnvelope) -> None:
        """`Task Pending`, then the message, then `sentAt`."""
        self.enqueue_many([envelope])

    def enqueue_many(self, envelopes: Sequence[TaskEnvelope]) -> None:
        """Like `enqueue` for many tasks, in batched calls (a fan-out sends hundreds)."""
        if not envelopes:
            return
        by_queue: dict[str, list[TaskEnvelope]] = {}
        for envelope in envelopes:
            by_queue.setdefault(self.queue_for(envelope), []).append(envelope)
        self._publisher.publish_all(
            event_of(
                "Task Pending",
                envelope,
                attempt=0,
                task_key=envelope.task_key,
                notBefore=envelope.not_before_ms,
            )
            for envelope in envelopes
        )
        for queue_url, group in by_queue.items():
            for batch in _message_batches(group):
                self._send_batch(queue_url, batch)
                # Marked batch by batch: a later batch's failure must not leave tasks
                # already sent (and perhaps already started) looking never sent.
                self._mark_all_sent(batch)

    def _mark_all_sent(self, envelopes: Sequence[TaskEnvelope]) -> None:
        """`sentAt` on each; one failed mark does not skip the others' (re-raised after)."""
        failure: Exception | None = None
        for envelope in envelopes:
            try:
                self._mark_sent(envelope)
            except ClientError as error:
                logger.warning("marking %s sent failed: %s", envelope.request_id, error)
                failure = failure or error
        if failure is not None:
            raise failure

    def _send_batch(self, queue_url: str, batch: Sequence[TaskEnvelope]) -> None:
        response = self._sqs.send_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {
                    "Id": str(index),
                    **envelope.send_fields(),
                    "DelaySeconds": self._delay_s(envelope),
                }
                for index, envelope in enumerate(batch)
            ],
        )
        for failed in response.get("Failed", []):
            if failed.get("SenderFault"):
                raise InvalidInput("message", f"SQS refused it: {failed.get('Message')}")
            # A throttled or internal failure of one entry: send it alone (boto3 retries).
            envelope = batch[int(failed["Id"])]
            self._sqs.send_message(
                QueueUrl=queue_url, **envelope.send_fields(), DelaySeconds=self._delay_s(envelope)
            )

    def _delay_s(self, envelope: TaskEnvelope) -> int:
        """SQS holds a delayed message up to 15 minutes; a longer delay is finished by
        the worker, which re-delays an early message through its visibility."""
        return min(self._max_delay_s, math.ceil(remaining_s(envelope.not_before_ms, now_ms())))

    def _mark_sent(self, envelope: TaskEnvelope) -> None:
        try:
            # A worker's lease renewal (a transaction) may hold the item already: the
            # message is out, so the conflict is retried rather than failing the send.
            retry_conflicts(
                lambda: self._ddb.update_item(
                    TableName=self._table,
                    Key={
                        "PK": {"S": keys.task_pk(envelope.tenant, envelope.request_id)},
                        "SK": {"S": keys.STATE_SK},
                    },
                    UpdateExpression="SET sentAt = :now",
                    ConditionExpression="attribute_exists(PK)",
                    ExpressionAttributeValues=values(now=now_ms()),
                )
            )
        except ClientError as error:
            if not condition_failed(error):
                raise


def _message_batches(envelopes: Sequence[TaskEnvelope]) -> list[list[TaskEnvelope]]:
    """SendMessageBatch takes at most 10 entries and 256 KB in all."""
    batches: list[list[TaskEnvelope]] = []
    batch: list[TaskEnvelope] = []
    size = 0
    for envelope in envelopes:
        body = len(envelope.to_body().encode()) + _ATTRIBUTE_ALLOWANCE
        if batch and (len(batch) == _MAX_BATCH or size + body > MAX_BODY_BYTES):
            batches.append(batch)
            batch, size = [], 0
        batch.append(envelope)
        size += body
    if batch:
        batches.append(batch)
    return batches
