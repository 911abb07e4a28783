"""Cancel's writes under AWS faults: retried after applied, conflicting, throttled, and
the heartbeat noticing a cancel when its renewal transaction conflicts."""

from __future__ import annotations

import uuid

import pytest
from conftest import Stack
from fault_support import faulty_client, injector, rule

from agentq.envelope import TaskEnvelope
from agentq.errors import CancelPending, CancelRequested, NotCancellable
from agentq.faults.config import Kind
from agentq.faults.injector import FaultInjector
from agentq.states import TaskState
from agentq.store.scheduling import cancel_orphan, request_cancel
from agentq.store.tasks import TaskStore


def _envelope() -> TaskEnvelope:
    return TaskEnvelope(
        request_id=f"c-{uuid.uuid4().hex[:12]}", tenant="acme", definition="sample-echo", input={}
    )


def _faulty(stack: Stack, *rules: object) -> tuple[TaskStore, object, FaultInjector]:
    faults = injector(*rules)  # type: ignore[arg-type]
    client = faulty_client(stack, "dynamodb", faults)
    return TaskStore(client, stack.resources.table_name), client, faults


@pytest.mark.parametrize(
    "kind", [Kind.APPLIED_THEN_FAILED, Kind.TRANSACTION_CONFLICT, Kind.THROTTLE]
)
def test_the_cancel_flag_on_a_running_task_survives_retries(stack: Stack, kind: Kind) -> None:
    """The flag write is conditional on the lease it saw: a retry of an applied write
    meets the same condition and writes the same flag, never a refusal."""
    envelope = _envelope()
    clean = TaskStore(stack.dynamodb, stack.resources.table_name)
    lease = clean.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    faulty, client, faults = _faulty(
        stack, rule("dynamodb:UpdateItem", kind, limit=1, match="cancelRequested")
    )
    record = clean.require("acme", envelope.request_id)
    result = request_cancel(faulty, client, stack.resources.table_name, record, "stop it")
    assert result.outcome == "requested"
    assert sum(faults.counts().values()) == 1  # the fault did meet the flag write
    stored = clean.require("acme", envelope.request_id)
    assert stored.state is TaskState.PROCESSING and stored.lease_token == lease.token
    assert stored.raw["cancelRequested"] is True and stored.raw["cancelReason"] == "stop it"
    # The holder's next renewal sees it, and only as a cancel (its lease is intact).
    renewals = clean.renew_leases([lease], lease_seconds=30)
    assert [c.token for c in renewals.cancelled] == [lease.token]
    assert not renewals.renewed and not renewals.lost
    with pytest.raises(CancelRequested):
        clean.renew(lease, lease_seconds=30)


@pytest.mark.parametrize("kind", [Kind.APPLIED_THEN_FAILED, Kind.TRANSACTION_CONFLICT])
def test_cancel_of_a_task_not_started_is_applied_once(stack: Stack, kind: Kind) -> None:
    envelope = _envelope()
    clean = TaskStore(stack.dynamodb, stack.resources.table_name)
    clean.create(envelope)
    faulty, client, faults = _faulty(
        stack, rule("dynamodb:UpdateItem", kind, limit=1, match="CANCELLED")
    )
    record = clean.require("acme", envelope.request_id)
    result = request_cancel(faulty, client, stack.resources.table_name, record, "not needed")
    assert result.outcome == "cancelled"
    assert sum(faults.counts().values()) == 1
    stored = clean.require("acme", envelope.request_id)
    assert stored.state is TaskState.CANCELLED
    assert stored.raw["terminalEvent"]["detailType"] == "Task Cancelled"
    with pytest.raises(NotCancellable):
        request_cancel(clean, stack.dynamodb, stack.resources.table_name, stored, "again")


def test_a_cancel_seen_through_a_conflicting_renewal_transaction(stack: Stack) -> None:
    """The renewal transaction conflicts, so leases are renewed one by one: the cancelled
    one is still told apart from a lost one, and the other lease is renewed."""
    cancelled_env, other_env = _envelope(), _envelope()
    clean = TaskStore(stack.dynamodb, stack.resources.table_name)
    doomed = clean.acquire(cancelled_env, worker_id="w1", lease_seconds=30, max_attempts=3)
    kept = clean.acquire(other_env, worker_id="w1", lease_seconds=30, max_attempts=3)
    record = clean.require("acme", cancelled_env.request_id)
    request_cancel(clean, stack.dynamodb, stack.resources.table_name, record, "stop")
    faulty, _, faults = _faulty(stack, rule("dynamodb:TransactWriteItems",
                                            Kind.TRANSACTION_CONFLICT, limit=1))  # fmt: skip
    renewals = faulty.renew_leases([doomed, kept], lease_seconds=30)
    assert [c.token for c in renewals.cancelled] == [doomed.token]
    assert [r.token for r in renewals.renewed] == [kept.token] and not renewals.lost
    assert sum(faults.counts().values()) == 1


def test_a_lapsed_holder_with_a_cancel_request_is_cancelled_not_rerun(stack: Stack) -> None:
    """The worker died after the flag was set: the next lock attempt closes the task
    instead of running it again."""
    envelope = _envelope()
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    store.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    request_cancel(store, stack.dynamodb, stack.resources.table_name,
                   store.require("acme", envelope.request_id), "stop")  # fmt: skip
    # The holder dies: its lease lapses (made so here by expiring it).
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": f"TASK#acme#{envelope.request_id}"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET effectiveUntil = :past",
        ExpressionAttributeValues={":past": {"N": "1"}},
    )
    with pytest.raises(CancelPending):
        store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3)
    assert cancel_orphan(store, "acme", envelope.request_id)
    final = store.require("acme", envelope.request_id)
    assert final.state is TaskState.CANCELLED and final.attempt == 1
    assert final.raw["terminalEvent"]["detailType"] == "Task Cancelled"
