"""The local stack delivers 'Task Requested' events to the task queue as EventBridge
does on AWS: the tenant (a dynamic path of the rule target) as MessageGroupId, so the
fair queues see it (agentq.local.rules.eventbridge_sqs_groups)."""

from __future__ import annotations

import json
from typing import Any

from conftest import Stack
from support import wait_for

from agentq.local.rules.eventbridge_sqs_groups import resolve_group


def _put(stack: Stack, detail: dict[str, Any]) -> None:
    answer = stack.events.put_events(
        Entries=[{"Source": stack.resources.names.app_name, "DetailType": "Task Requested",
                  "Detail": json.dumps(detail), "EventBusName": stack.resources.bus_name}]
    )  # fmt: skip
    assert answer["FailedEntryCount"] == 0


def _delivered(stack: Stack, count: int) -> dict[str, str | None]:
    """request id -> MessageGroupId of `count` delivered messages."""
    found: dict[str, str | None] = {}

    def receive() -> bool:
        for message in stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
            MessageSystemAttributeNames=["MessageGroupId"],
        ).get("Messages", []):  # fmt: skip
            detail = json.loads(message["Body"])["detail"]
            found[detail["requestId"]] = message.get("Attributes", {}).get("MessageGroupId")
        return len(found) >= count

    wait_for(receive, timeout=30, message=f"{count} events on the task queue ({found})")
    return found


def test_a_task_requested_event_reaches_the_task_queue_grouped_by_its_tenant(
    stack: Stack,
) -> None:
    """moto alone sends the path's text as every message's group, or (a standard queue)
    fails the delivery; on AWS the tenant is the group."""
    _put(stack, {"requestId": "bus-acme", "tenant": "acme", "definition": "sample-echo"})
    _put(stack, {"requestId": "bus-other", "tenant": "other", "definition": "sample-echo"})
    _put(stack, {"requestId": "bus-default", "definition": "sample-echo"})
    assert _delivered(stack, 3) == {"bus-acme": "acme", "bus-other": "other",
                                    "bus-default": None}  # fmt: skip


def test_a_dynamic_path_is_read_from_the_event() -> None:
    event = {"detail": {"tenant": "acme", "n": 3}}
    assert resolve_group("$.detail.tenant", event) == "acme"
    assert resolve_group("static", event) == "static"
    assert resolve_group("$.detail.missing", event) is None
    assert resolve_group("$.detail.n", event) is None  # not a string
    assert resolve_group(None, event) is None
