"""dlq-processor: closes out tasks whose messages SQS moved to the dead-letter queue.

SQS event source on the DLQ with partial batch responses: each record is archived to
S3; a task with attempts left is sent back to the task queue (a bounded number of
times, agentq/dlq/returns.py), any other marked FAILED (unless terminal, or a live lease
says a worker still has it) and one `Task Failed` emitted. A malformed message is archived and its record
succeeds, so it never cycles; if its request id is readable, that task ends FAILED with
the parse error (agentq/dlq/malformed.py). Infrastructure errors (S3, DynamoDB, EventBridge) fail a
record, and so does a live lease (the holder may die before it settles the task): the
Lambda service then retries just that record, until the task ends or its lease lapses.

A live lease is a normal wait, not an error: its record is reported in
`batchItemFailures` even when every record of the batch waits, so the function's
Errors metric (and its alarm) counts only real failures. A batch in which no record
succeeded and at least one failed for a real reason still fails the invocation. Each
wait emits `DeadLetterWaitSeconds` (seconds since the message was first sent, which a
dead-letter move keeps): its Maximum is what an alarm on a record that keeps waiting reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.dlq import DeadLetter, DlqArchive, DlqProcessor, DlqResult, DlqReturner
from agentq.errors import TaskStillHeld
from agentq.publisher import EventPublisher
from agentq.store import TaskStore
from lambdas._common import powertools, runtime

logger, metrics = powertools("dlq-processor")
WAIT_METRIC: Final = "DeadLetterWaitSeconds"


def _processor() -> DlqProcessor:
    rt = runtime()
    settings = rt.settings.require("table_name", "bucket", "bus_name", "queue_url")
    clients = rt.clients
    bucket = settings.required("bucket")
    table_name = settings.required("table_name")
    return DlqProcessor(
        tasks=TaskStore(clients.dynamodb, table_name),
        archive=DlqArchive(clients.s3, bucket),
        publisher=EventPublisher(
            clients.events,
            bus_name=settings.required("bus_name"),
            source=settings.app_name,
            s3_client=clients.s3,
            bucket=bucket,
        ),
        default_tenant=settings.tenant_id,
        returner=DlqReturner(
            dynamodb=clients.dynamodb,
            table_name=table_name,
            sqs=clients.sqs,
            queue_url=settings.required("queue_url"),
        ),
    )


def record_handler(record: SQSRecord, processor: DlqProcessor) -> DlqResult:
    result = processor.process(DeadLetter.from_lambda_record(record.raw_event))
    metrics.add_metric(name=f"DeadLetters_{result.outcome}", unit=MetricUnit.Count, value=1)
    if result.outcome == "lease-live":
        # A live lease may belong to a worker that is about to die (a prefetched lock,
        # a kill): only its end or its lapse settles the task. Fail the record, so SQS
        # brings it back after the DLQ's visibility timeout and this looks again.
        waited_s = waited_seconds(record.raw_event)
        metrics.add_metric(name=WAIT_METRIC, unit=MetricUnit.Seconds, value=waited_s)
        logger.info("dead letter waits for its holder", extra={
            "messageId": result.message_id, "requestId": result.request_id,
            "detail": result.detail, "waitedSeconds": waited_s})  # fmt: skip
        raise TaskStillHeld(result.request_id or "", result.detail or "")
    log = logger.warning if result.outcome == "malformed" else logger.info
    log(
        "dead letter closed out",
        extra={
            "messageId": result.message_id,
            "requestId": result.request_id,
            "outcome": result.outcome,
            "detail": result.detail,
            "archiveKey": result.archive_key,
        },
    )
    return result


def waited_seconds(record: Mapping[str, Any], *, now_s: float | None = None) -> float:
    """Seconds since the message was first sent (0 when SQS did not say)."""
    attributes = record.get("attributes") or {}
    try:
        sent_ms = int(attributes.get("SentTimestamp", ""))
    except ValueError:
        return 0.0
    now = time.time() if now_s is None else now_s
    return round(max(0.0, now - sent_ms / 1000), 3)


def partial_response(batch: BatchProcessor) -> PartialItemFailureResponse:
    """The failed records; raises when nothing succeeded and some record really failed
    (waits on a live lease alone are not an error of the function)."""
    response = batch.response()
    if batch.success_messages or not batch.fail_messages:
        return response
    errors = [info for info in batch.exceptions if not isinstance(info[1], TaskStillHeld)]
    if errors:
        raise BatchProcessingError(
            msg=f"All records failed processing. {len(errors)} errors.",
            child_exceptions=errors,
        )
    return response


def warm() -> None:
    """What the first invocation builds: settings, boto3 and the processor's clients."""
    _processor()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    processor = _processor()
    # Entire-batch failures are judged below: a batch of waits is not an error.
    batch = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    with batch(event.get("Records") or [], lambda record: record_handler(record, processor)):
        batch.process()
    return partial_response(batch)
