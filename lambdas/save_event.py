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
from typing import TYPE_CHECKING, Any, Final, Literal

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.envelope import check_storable
from agentq.errors import InvalidInput
from agentq.events import Event
from agentq.schedule import MAX_EPOCH_MS
from agentq.store import EventStore
from agentq.store.events import event_item
from lambdas._common import powertools, runtime, warm_clients

if TYPE_CHECKING:
    from agentq.config import Settings

logger, metrics = powertools("save-event")

# DynamoDB's key size limits (partition 2,048 bytes, sort 1,024), for the table's key
# and the byTenant and byType index keys of an event item.
_KEY_BYTES: Final = {"PK": 2048, "SK": 1024, "tenantPK": 2048, "tenantSK": 1024,
                     "typePK": 2048, "typeSK": 1024}  # fmt: skip

Outcome = Literal["stored", "duplicate", "skipped", "malformed"]


def check_item(event: Event, settings: Settings) -> None:
    """Refuse, as `InvalidInput`, an event whose item the events table would not take.

    A forged `source=agentq` event reaches this Lambda with whatever detail it likes;
    what building or writing its item would fail on must be found here, where it is
    counted malformed, not by the write, whose error EventBridge would retry forever.
    """
    if not 0 <= event.timestamp_ms <= MAX_EPOCH_MS:
        # The sort key holds the time as ISO text, which stops at year 9999 (a later
        # time has no ISO form: OSError, ValueError).
        raise InvalidInput("timestampMs", f"must be epoch ms from 0 to {MAX_EPOCH_MS}")
    if event.payload_pointer is not None and not isinstance(event.payload_pointer, Mapping):
        raise InvalidInput("payloadPointer", "must be a JSON object")
    item = event_item(event, app_name=settings.app_name, ttl_days=settings.event_ttl_days)
    # Depth 0: the detail's fields are the item's own attributes, so `payload` sits
    # where the envelope sits in a STATE item and gets the same nesting allowance.
    check_storable(item, name="detail", depth=0)
    for name, limit in _KEY_BYTES.items():
        size = len(item[name].encode())
        if size > limit:
            raise InvalidInput(name, f"key of {size} bytes; DynamoDB allows {limit}")


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
        check_item(event, settings)
    except (InvalidInput, KeyError, TypeError, ValueError) as exc:
        # The reason is the field and the problem, never the detail itself; it is cut
        # short since a problem may quote a value (`int('...')`) or a key's start.
        logger.warning(
            "malformed event rejected",
            extra={"reason": str(exc)[:200], "eventBridgeId": envelope.get("id")},
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
