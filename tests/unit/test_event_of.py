"""One builder names a task's events from its record or its envelope (agentq.events)."""

from __future__ import annotations

from agentq.envelope import TaskEnvelope
from agentq.events import event_of
from agentq.states import TaskState
from agentq.store.records import TaskRecord


def _record(attempt: int) -> TaskRecord:
    return TaskRecord(request_id="r-1", tenant="acme", state=TaskState.PROCESSING,
                      attempt=attempt, definition="sample-echo", job_id="j-1", owner=None,
                      lease_token=None, effective_until_ms=None, created_at_ms=None,
                      updated_at_ms=None, raw={})  # fmt: skip


def test_a_records_event_carries_its_identity_and_attempt_and_the_payload() -> None:
    detail = event_of("Task Repaired", _record(3), repair="pending_lost", detail=None).to_detail()

    assert (detail["requestId"], detail["tenant"], detail["jobId"], detail["definition"],
            detail["attempt"]) == ("r-1", "acme", "j-1", "sample-echo", 3)  # fmt: skip
    assert detail["payload"] == {"repair": "pending_lost"}  # None values are left out


def test_an_envelope_has_no_attempt_and_a_given_attempt_wins() -> None:
    envelope = TaskEnvelope(request_id="r-2", tenant="acme", definition="sample-echo", input={})

    assert event_of("Task Pending", envelope).to_detail()["attempt"] == 0
    assert event_of("Task Pending", _record(3), attempt=0).to_detail()["attempt"] == 0
