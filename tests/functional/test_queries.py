"""Each query pattern returns the right items in the right order, through its index."""

from __future__ import annotations

from typing import Any

from conftest import Stack
from support import settle_indexes

from agentq.envelope import TaskEnvelope
from agentq.events import Event, task_event
from agentq.states import TaskState
from agentq.store import EventStore, TaskStore


class _RecordingDynamo:
    """Wraps a real client and notes which index each query used."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.indexes: list[str | None] = []

    def query(self, **kwargs: Any) -> Any:
        self.indexes.append(kwargs.get("IndexName"))
        return self._client.query(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _event(kind: Any, request_id: str, ts: int, tenant: str = "acme", **kw: Any) -> Event:
    return Event(detail_type=kind, request_id=request_id, tenant=tenant, timestamp_ms=ts, **kw)


def test_task_timeline_in_time_order(stack: Stack) -> None:
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    base = 1_700_000_000_000
    kinds = ["Task Pending", "Task Processing Started", "Task Heartbeat", "Task Completed"]
    for offset, kind in reversed(list(enumerate(kinds))):
        events.append(_event(kind, "r1", base + offset * 1000))
    events.append(_event("Task Pending", "r2", base))
    timeline = events.timeline("acme", "r1")
    assert [item["detailType"] for item in timeline] == kinds


def test_event_append_is_idempotent(stack: Stack) -> None:
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    event = task_event("Task Completed", request_id="r1", tenant="acme", cost_usd=0.25)
    assert events.append(event, ttl_days=7) is True
    assert events.append(event, ttl_days=7) is False
    timeline = events.timeline("acme", "r1")
    assert len(timeline) == 1
    assert timeline[0]["payload"] == {"cost_usd": 0.25}
    assert timeline[0]["ttl"] == (event.timestamp_ms + 7 * 86_400_000) // 1000


def test_tenant_events_and_events_by_type_use_their_indexes(stack: Stack) -> None:
    recording = _RecordingDynamo(stack.dynamodb)
    events = EventStore(recording, stack.resources.table_name, app_name="agentq")
    base = 1_700_000_000_000
    events.append(_event("Task Completed", "a", base + 3000))
    events.append(_event("Task Failed", "b", base + 1000))
    events.append(_event("Task Completed", "c", base + 2000))
    events.append(_event("Task Completed", "d", base + 500, tenant="other"))
    settle_indexes(stack)  # indexes lag the table

    tenant = events.tenant_events("acme", since_ms=base)
    assert [item["requestId"] for item in tenant] == ["b", "c", "a"]
    window = events.tenant_events("acme", since_ms=base + 1500, until_ms=base + 2500)
    assert [item["requestId"] for item in window] == ["c"]
    completed = events.events_by_type("Task Completed")
    assert [item["requestId"] for item in completed] == ["d", "c", "a"]
    assert recording.indexes == ["byTenant", "byTenant", "byType"]


def test_tasks_of_a_job_through_the_job_index(stack: Stack) -> None:
    recording = _RecordingDynamo(stack.dynamodb)
    store = TaskStore(recording, stack.resources.table_name)
    for key in ("b", "a", "c"):
        store.create(TaskEnvelope(request_id=f"j1-{key}", tenant="acme", definition="echo",
                                  job_id="j1", task_key=key), state=TaskState.BLOCKED)  # fmt: skip
    store.create(TaskEnvelope(request_id="j2-a", tenant="acme", definition="echo", job_id="j2"))
    store.create(TaskEnvelope(request_id="solo", tenant="acme", definition="echo"))
    settle_indexes(stack)
    tasks = store.tasks_of_job("acme", "j1")
    assert [t.request_id for t in tasks] == ["j1-a", "j1-b", "j1-c"]
    assert recording.indexes == ["byJob"]


def test_tasks_by_status_ordered_by_due_time_across_shards(stack: Stack) -> None:
    recording = _RecordingDynamo(stack.dynamodb)
    store = TaskStore(recording, stack.resources.table_name)
    leases = {}
    # Different lease lengths give different due times; ids spread over the shards.
    for index, seconds in enumerate([50, 10, 40, 20, 30, 5]):
        envelope = TaskEnvelope(request_id=f"s-{index}", tenant="acme", definition="echo")
        leases[envelope.request_id] = store.acquire(
            envelope, worker_id="w", lease_seconds=seconds, max_attempts=3
        )
    store.create(TaskEnvelope(request_id="waiting", tenant="acme", definition="echo"))
    done = store.acquire(TaskEnvelope(request_id="done", tenant="acme", definition="echo"),
                         worker_id="w", lease_seconds=1, max_attempts=3)  # fmt: skip
    store.finalize(done, TaskState.COMPLETED)
    settle_indexes(stack)

    processing = store.tasks_by_status(TaskState.PROCESSING)
    assert [t.request_id for t in processing] == ["s-5", "s-1", "s-3", "s-4", "s-2", "s-0"]
    assert {i for i in recording.indexes} == {"byStatus"}
    cutoff = leases["s-3"].effective_until_ms + 1
    due = store.tasks_by_status(TaskState.PROCESSING, due_before_ms=cutoff)
    assert [t.request_id for t in due] == ["s-5", "s-1", "s-3"]
    assert [t.request_id for t in store.tasks_by_status(TaskState.PENDING)] == ["waiting"]
    # Terminal tasks leave the status index.
    assert store.tasks_by_status(TaskState.COMPLETED) == []
