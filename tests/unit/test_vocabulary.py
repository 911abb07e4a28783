from __future__ import annotations

import json

import pytest

from agentq.envelope import TaskEnvelope, parse_message
from agentq.errors import InvalidInput, InvalidRequestId, InvalidTransition, UnknownEventType
from agentq.events import Event, task_event
from agentq.states import TaskState, can_transition, check_transition


def test_state_machine_edges() -> None:
    assert can_transition(TaskState.PENDING, TaskState.PROCESSING)
    assert can_transition(TaskState.PROCESSING, TaskState.RETRYING)
    assert can_transition(TaskState.RETRYING, TaskState.PROCESSING)
    assert can_transition(TaskState.BLOCKED, TaskState.PENDING)
    assert not can_transition(TaskState.BLOCKED, TaskState.PROCESSING)
    for terminal in (TaskState.COMPLETED, TaskState.FAILED, TaskState.TIMEOUT):
        assert terminal.terminal
        for target in TaskState:
            assert not can_transition(terminal, target)
    with pytest.raises(InvalidTransition):
        check_transition(TaskState.COMPLETED, TaskState.PROCESSING)


def test_event_detail_carries_every_common_field() -> None:
    event = task_event(
        "Task Heartbeat", request_id="r-1", tenant="acme", job_id="j1", attempt=2,
        worker_id="w1", definition="summarize", effective_until_ms=99,
    )  # fmt: skip
    detail = event.to_detail()
    for name in ("eventId", "requestId", "tenant", "jobId", "attempt", "workerId", "state",
                 "effectiveUntil", "timestamp", "payload"):  # fmt: skip
        assert name in detail
    assert detail["state"] == "PROCESSING"
    assert Event.from_detail(json.loads(json.dumps(detail))) == event


def test_terminal_events_never_expire() -> None:
    with pytest.raises(InvalidInput):
        task_event("Task Completed", request_id="r1", tenant="t", effective_until_ms=5)
    assert (
        task_event("Task Completed", request_id="r1", tenant="t").to_detail()["effectiveUntil"]
        is None
    )


def test_unknown_event_type_and_bad_request_id() -> None:
    with pytest.raises(UnknownEventType):
        Event.from_detail({"detailType": "Task Exploded", "tenant": "t"})
    with pytest.raises(InvalidRequestId):
        task_event("Task Pending", request_id="has space", tenant="t")


def test_event_without_job_omits_job_id() -> None:
    # EventBridge's {"exists": true} would match a null jobId.
    assert "jobId" not in task_event("Task Failed", request_id="r", tenant="t").to_detail()


def _attrs(request_id: str) -> dict[str, dict[str, str]]:
    return {"requestId": {"DataType": "String", "StringValue": request_id}}


def test_parse_message_round_trip() -> None:
    envelope = TaskEnvelope(request_id="r-1", tenant="acme", definition="echo", input={"a": 1})
    parsed = parse_message(envelope.to_body(), envelope.message_attributes(), default_tenant="x")
    assert parsed == envelope


@pytest.mark.parametrize(
    ("body", "attributes", "field"),
    [
        ("not json", _attrs("r1"), "body"),
        ("[1, 2]", _attrs("r1"), "body"),
        ('{"definition": "echo"}', _attrs("bad id!"), "requestId"),
        ('{"definition": "echo"}', _attrs("x" * 257), "requestId"),
        ('{"definition": "echo"}', None, "requestId"),
        ('{"input": {}}', _attrs("r1"), "definition"),
        ('{"definition": "../etc"}', _attrs("r1"), "definition"),
        ('{"definition": "echo", "input": [1]}', _attrs("r1"), "input"),
        ('{"definition": "echo", "requestId": "other"}', _attrs("r1"), "requestId"),
    ],
)
def test_parse_message_rejects_bad_input(
    body: str, attributes: dict[str, dict[str, str]] | None, field: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_message(body, attributes, default_tenant="t")
    assert caught.value.field == field


def test_task_requested_event_envelope_is_unwrapped() -> None:
    body = json.dumps(
        {"detail-type": "Task Requested", "source": "billing",
         "detail": {"requestId": "r-9", "definition": "echo", "input": {"x": 1}}}
    )  # fmt: skip
    parsed = parse_message(body, None, default_tenant="default")
    assert (parsed.request_id, parsed.tenant, parsed.input) == ("r-9", "default", {"x": 1})
