"""Event shapes the Lambda service delivers, built the way AWS builds them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentq.events import Event


def eventbridge_envelope(event: Event, *, source: str = "agentq") -> dict[str, Any]:
    """The envelope a rule target receives for a published agentq event."""
    entry = event.to_entry(source=source, bus_name="bus")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": entry["DetailType"],
        "source": source,
        "account": "123456789012",
        "time": entry["Time"].strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "eu-west-1",
        "resources": [],
        "detail": json.loads(entry["Detail"]),
    }


def scheduled_event() -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "2026-01-01T00:00:00Z",
        "region": "eu-west-1",
        "resources": ["arn:aws:events:eu-west-1:123456789012:rule/agentq-health"],
        "detail": {},
    }
