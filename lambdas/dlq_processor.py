"""dlq-processor: closes out tasks whose messages SQS moved to the dead-letter queue.

SQS event source on the DLQ with partial batch responses: each record is archived to
S3; a task with attempts left is sent back to the task queue (a bounded number of
times, agentq/dlq_return.py), any other marked FAILED (unless terminal, or a live lease
says a worker still has it) and one `Task Failed` emitted. A malformed message is archived and its record
succeeds, so it never cycles; if its request id is readable, that task ends FAILED with
the parse error (agentq/dlq_malformed.py). Infrastructure errors (S3, DynamoDB, EventBridge) fail a
record, and so does a live lease (the holder may die before it settles the task): the
Lambda service then retries just that record, until the task ends or its lease lapses.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.dlq import DeadLetter, DlqArchive, DlqProcessor, DlqResult, DlqReturner
from agentq.errors import TaskStillHeld
from agentq.publisher import EventPublisher
from agentq.store import TaskStore
from lambdas._common import powertools, runtime

logger, metrics = powertools("dlq-processor")


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
        logger.info("dead letter waits for its holder", extra={
            "messageId": result.message_id, "requestId": result.request_id,
            "detail": result.detail})  # fmt: skip
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


def warm() -> None:
    """What the first invocation builds: settings, boto3 and the processor's clients."""
    _processor()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    processor = _processor()
    return process_partial_response(
        event=event,
        record_handler=lambda record: record_handler(record, processor),
        processor=BatchProcessor(event_type=EventType.SQS),
        context=context,
    )
