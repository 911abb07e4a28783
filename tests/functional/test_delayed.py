"""Delayed tasks through the real queue and a real worker: SCHEDULED until due, never
received early into an attempt, re-delayed past SQS's 15 minutes, and cancellable."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import Stack
from support import EventLog, logged_ms, settle_indexes, wait_for

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.errors import NotCancellable, TaskNotReady
from agentq.events import now_ms
from agentq.health import HealthChecker
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env
from agentq.reconcile.messages import LostMessages
from agentq.reconcile.model import Repair
from agentq.states import TaskState
from agentq.store import EventStore, Lease, TaskStore

pytestmark = pytest.mark.timeout(120)


def new_id() -> str:
    return f"d-{uuid.uuid4().hex[:12]}"


def queue_counts(stack: Stack, url: str | None = None) -> tuple[int, int]:
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=url or stack.resources.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


@contextmanager
def running_worker(stack: Stack, **overrides: str) -> Iterator[WorkerProcess]:
    worker = WorkerProcess("delayed")
    with worker.start({**stack.env(), **fast_env(**overrides)}):
        try:
            yield worker
        except BaseException:
            print(f"--- worker output ---\n{worker.output()[-6000:]}")
            raise


def client_with(monkeypatch: pytest.MonkeyPatch, **env: str) -> AgentqClient:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return AgentqClient.from_env()


def test_a_delayed_task_is_scheduled_then_runs_after_its_time(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_with(monkeypatch)
    events = EventLog(stack)
    record = client.submit("sample-echo", {"v": 1}, delay=3)
    due = int(record.raw["notBefore"])
    assert record.state is TaskState.SCHEDULED
    # Due at its notBefore in the status index: not "waiting" (health, reconciler) before.
    settle_indexes(stack)
    scheduled = client.tasks.tasks_by_status(TaskState.SCHEDULED)
    assert record.request_id in {r.request_id for r in scheduled}
    early = client.tasks.tasks_by_status(TaskState.SCHEDULED, due_before_ms=due)
    assert record.request_id not in {r.request_id for r in early}
    assert events.wait(record.request_id, "Task Pending")[0]["payload"]["notBefore"] == due

    with running_worker(stack):
        started = events.wait(record.request_id, "Task Processing Started")[0]
        events.wait(record.request_id, "Task Completed")
        wait_for(lambda: queue_counts(stack) == (0, 0), message="task queue empty")

    assert started["timestampMs"] >= due
    final = client.get_task(record.request_id)
    assert final.state is TaskState.COMPLETED and final.attempt == 1


def test_a_delay_longer_than_sqs_holds_is_re_delayed_without_spending_attempts(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Test-sized: SQS holds the message 1 s of the 6, the worker re-delays the rest 1 s
    # at a time (as it would 15 minutes, then 12 hours at a time, in production).
    client = client_with(monkeypatch, MAX_MESSAGE_DELAY="1")
    events = EventLog(stack)
    with running_worker(stack, MAX_REDELAY="1") as worker:
        # Submitted once the worker receives: however slowly it started, the wait left
        # is the whole delay (several re-delays), not what its start-up left of it.
        worker.wait_for_output("worker started", timeout=90)
        record = client.submit("sample-echo", {"v": 2}, delay=6)
        due = int(record.raw["notBefore"])
        started = events.wait(record.request_id, "Task Processing Started")[0]
        events.wait(record.request_id, "Task Completed")
        redelays = [r for r in worker.log_records()
                    if r.get("message") == "task not due yet; re-delayed"]  # fmt: skip

    # How many re-delays fit depends on how fast a loaded host goes round (CI once did only
    # one in 5 s); what may not vary: each waits at most MAX_REDELAY, one of them while
    # more than that was left (the clamp at work), and the task starts once due.
    assert redelays and all(r["delay_s"] <= 1.0 for r in redelays), redelays
    assert any(due - logged_ms(r) > 1_500 for r in redelays), (due, redelays)
    assert started["timestampMs"] >= due
    final = client.get_task(record.request_id)
    assert final.state is TaskState.COMPLETED and final.attempt == 1
    assert not events.of(record.request_id, "Task Processing Failed")
    assert queue_counts(stack, stack.resources.dlq_url) == (0, 0)


def test_a_scheduled_task_cancelled_before_it_starts_never_runs(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No SQS delay at all: the worker sees the message at once and must not run it.
    client = client_with(monkeypatch, MAX_MESSAGE_DELAY="0")
    events = EventLog(stack)
    record = client.submit("sample-echo", {"v": 3}, not_before=(now_ms() + 600_000) / 1000)
    assert record.state is TaskState.SCHEDULED
    [answer] = client.cancel(record.request_id)
    assert (answer.request_id, answer.outcome, answer.state) == (
        record.request_id, "cancelled", "CANCELLED")  # fmt: skip
    cancelled = client.get_task(record.request_id)
    assert cancelled.state is TaskState.CANCELLED
    assert cancelled.raw["terminalEvent"]["payload"]["reason"] == "cancelled by request"
    events.wait(record.request_id, "Task Cancelled")

    with running_worker(stack):
        # Received, found finished, deleted as a duplicate.
        wait_for(lambda: queue_counts(stack) == (0, 0), message="the message deleted")
    assert not events.of(record.request_id, "Task Processing Started")
    with pytest.raises(NotCancellable, match="already CANCELLED"):
        client.cancel(record.request_id)


def test_a_foreign_delayed_message_gets_a_scheduled_item_and_no_attempt(stack: Stack) -> None:
    """A sender other than agentq's client (or a `Task Requested` event) writes no STATE
    item: the worker that receives it early records it SCHEDULED, then runs it once due."""
    events = EventLog(stack)
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    with running_worker(stack) as worker:
        # Due a while after the worker is up, so it receives the message early (a loaded
        # host's receive has taken a few seconds).
        worker.wait_for_output("worker started", timeout=90)
        due = now_ms() + 6000
        envelope = TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-echo",
                                not_before_ms=due)  # fmt: skip
        stack.sqs.send_message(
            QueueUrl=stack.resources.queue_url,
            MessageBody=envelope.to_body(),
            MessageAttributes=envelope.message_attributes(),
        )
        seen = wait_for(lambda: store.get("acme", envelope.request_id), message="STATE item")
        events.wait(envelope.request_id, "Task Completed")
    assert (seen.state, seen.attempt, seen.raw["notBefore"]) == (TaskState.SCHEDULED, 0, due)
    started = events.of(envelope.request_id, "Task Processing Started")
    assert len(started) == 1 and started[0]["timestampMs"] >= due
    assert store.require("acme", envelope.request_id).attempt == 1


def test_the_lock_refuses_a_task_before_its_time_and_takes_it_after(stack: Stack) -> None:
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    due = now_ms() + 4000  # past a loaded host's create and first acquire
    envelope = TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-echo",
                            not_before_ms=due)  # fmt: skip
    store.create(envelope, state=TaskState.SCHEDULED)
    early = TaskEnvelope.from_dict({**envelope.to_dict(), "notBefore": None},
                                   default_tenant="acme")  # fmt: skip
    # Even a message that says nothing of the delay cannot run the task early.
    with pytest.raises(TaskNotReady) as refused:
        store.acquire(early, worker_id="w1", lease_seconds=30, max_attempts=3)
    assert refused.value.not_before_ms == due
    lease = wait_for(lambda: _try_lock(store, envelope), timeout=15, message="due and locked")
    assert lease.attempt == 1
    # Cancelled once finished? Not a duplicate write: a clear refusal.
    cancelled = store.transition("acme", envelope.request_id, from_states=[TaskState.SCHEDULED],
                                 to_state=TaskState.CANCELLED)  # fmt: skip
    assert cancelled is None


def test_a_job_task_with_a_time_waits_scheduled_until_then(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_with(monkeypatch)
    # Far enough ahead that creating the job cannot reach it: with a 3 s lead, a loaded
    # host's create_job (the job, both tasks, A's send) took past the last whole second
    # of the wait and A was rightly created PENDING.
    due = now_ms() + 8000
    spec = {
        "tasks": {
            "A": {"definition": "sample-echo", "not_before": due / 1000},
            "B": {"definition": "sample-echo", "input": {"a": "${tasks.A.result}"}},
        }
    }
    job = client.create_job(spec, job_id=f"j{uuid.uuid4().hex[:8]}")
    assert job.spec.task("A").not_before_ms == due
    a = client.get_task(f"{job.job_id}-A")
    assert a.state is TaskState.SCHEDULED and a.raw["notBefore"] == due
    assert client.get_task(f"{job.job_id}-B").state is TaskState.BLOCKED
    # Held by SQS until its time: not receivable before it, receivable after.
    received = wait_for(lambda: _receive(stack), timeout=30, message="A's message")
    assert now_ms() >= due - 1000  # DelaySeconds is whole seconds
    assert received["requestId"] == a.request_id and received["notBefore"] == due
    # A stored spec parses back to the same time.
    assert client.get_job(job.job_id).spec.task("A").not_before_ms == due


def test_health_and_reconciler_leave_a_scheduled_task_alone_until_its_time(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PENDING_ALERT_AFTER", "0")
    settings = Settings.from_env()
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    created = now_ms()
    due = created + 3_600_000
    envelope = TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-echo",
                            not_before_ms=due)  # fmt: skip
    store.create(envelope, state=TaskState.SCHEDULED)
    # Both read the status index: "not found yet" must not pass for "left alone".
    settle_indexes(stack)
    health = HealthChecker(
        tasks=store,
        events=EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq"),
        sqs=stack.sqs,
        settings=settings,
    )
    lost = LostMessages(
        tasks=store, dynamodb=stack.dynamodb, table_name=stack.resources.table_name,
        sqs=stack.sqs, queue_url=stack.resources.queue_url,
        publisher=AgentqClient.from_env().publisher, lost_after_s=60,
    )  # fmt: skip

    def findings(at: int) -> list[str]:
        report = health.check(at_ms=at)
        return [f.condition for f in report.findings if f.subject == envelope.request_id]

    def repaired(at: int) -> list[str]:
        repairs: list[Repair] = []
        lost.run(at, repairs, [])
        return [r.kind for r in repairs if r.subject == envelope.request_id]

    # An hour waiting since it was created, but not yet due: neither starving nor lost.
    assert findings(created + 3_500_000) == [] and repaired(created + 3_500_000) == []
    # Due and still not taken long after: both notice, as for a PENDING task.
    assert findings(due + 120_000) == ["starving"]
    assert repaired(due + 120_000) == ["pending_lost"]


def _receive(stack: Stack) -> dict[str, object] | None:
    messages = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=0
    ).get("Messages", [])
    return json.loads(messages[0]["Body"]) if messages else None


def _try_lock(store: TaskStore, envelope: TaskEnvelope) -> Lease | None:
    try:
        return store.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    except TaskNotReady:
        return None
