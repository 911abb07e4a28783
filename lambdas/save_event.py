"""save-event: every agentq event from EventBridge into the events table.

The rule on source `agentq` invokes this with the EventBridge envelope. Appending is
idempotent on the event id, so a redelivered event is a no-op. An oversize event's
`payloadPointer` is stored as it came (the blob stays in S3). `Task Heartbeat` is not
persisted unless PERSIST_HEARTBEATS is on: the STATE item already holds the last beat;
`Task Requested` (a producer's request, which its own rule queues) is skipped too.

A malformed event is logged and counted and the invocation returns normally: raising
would make EventBridge retry an event that can never succeed. Errors talking to
DynamoDB do raise, so the Lambda service retries them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.errors import InvalidInput
from agentq.events import Event
from agentq.store import EventStore
from lambdas._common import powertools, runtime, warm_clients

if TYPE_CHECKING:
    from agentq.config import Settings

logger, metrics = powertools("save-event")

Outcome = Literal["stored", "duplicate", "skipped", "malformed"]


def save(envelope: Mapping[str, Any], store: EventStore, settings: Settings) -> Outcome:
    """Persist one EventBridge envelope; the outcome says what happened to it."""
    try:
        parsed = EventBridgeEvent(dict(envelope))
        if parsed.source != settings.app_name:
            raise InvalidInput("source", f"expected {settings.app_name!r}, got {parsed.source!r}")
        detail = parsed.detail
        if not isinstance(detail, Mapping):
            raise InvalidInput("detail", "must be a JSON object")
        if parsed.detail_type == "Task Requested":
            # A producer's request, not a step of a task's life: its rule queues it, and
            # the worker's lock records the task. Nothing to store, nothing malformed.
            return "skipped"
        event = Event.from_detail(detail, parsed.detail_type)
    except (InvalidInput, KeyError, TypeError, ValueError) as exc:
        logger.warning(
            "malformed event rejected",
            extra={"reason": str(exc), "eventBridgeId": envelope.get("id")},
        )
        return "malformed"
    if event.detail_type == "Task Heartbeat" and not settings.persist_heartbeats:
        return "skipped"
    stored = store.append(event, ttl_days=settings.event_ttl_days)
    return "stored" if stored else "duplicate"


def warm() -> None:
    """What the first invocation builds: settings, boto3 and the DynamoDB client."""
    warm_clients("dynamodb")


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    rt = runtime()
    settings = rt.settings.require("table_name")
    store = EventStore(rt.clients.dynamodb, settings.required("table_name"),
                       app_name=settings.app_name)  # fmt: skip
    outcome = save(event, store, settings)
    metrics.add_metric(name=f"Events{outcome.capitalize()}", unit=MetricUnit.Count, value=1)
    logger.debug("event handled", extra={"outcome": outcome, "eventBridgeId": event.get("id")})
    return {"outcome": outcome}
