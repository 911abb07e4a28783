"""Event shapes the Lambda service delivers, built the way AWS builds them."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.events import Event
from agentq.local.slack_standin import SlackStandIn


@contextlib.contextmanager
def slack_for_health_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackStandIn]:
    """The local Slack stand-in, with the health check's settings pointing at it."""
    with SlackStandIn() as standin:
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-local-test")
        monkeypatch.setenv("ALERT_CHANNEL", "#agentq-alerts")
        monkeypatch.setenv("SLACK_API_URL", standin.base_url)
        yield standin


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
