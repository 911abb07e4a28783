"""The cancel promise in the STATE item's transitions: once a cancel was requested, no
new attempt starts (the lock refuses and the refusal ends the task CANCELLED) and an
attempt that ends retryable ends CANCELLED instead, with and without a tenant seat."""

from __future__ import annotations

import uuid

import pytest
from conftest import Stack

from agentq.envelope import TaskEnvelope
from agentq.errors import CancelPending, CancelRequested
from agentq.states import TaskState
from agentq.store import Lease, TaskStore
from agentq.store.scheduling import cancel_orphan, request_cancel


def _envelope() -> TaskEnvelope:
    return TaskEnvelope(
        request_id=f"cp-{uuid.uuid4().hex[:12]}", tenant="acme", definition="echo", input={}
    )


def _store(stack: Stack) -> TaskStore:
    return TaskStore(stack.dynamodb, stack.resources.table_name)


def _running_and_flagged(stack: Stack, envelope: TaskEnvelope, tenant_limit: int) -> Lease:
    """A running attempt whose cancel the caller was told is requested."""
    store = _store(stack)
    lease = store.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3,
                          tenant_limit=tenant_limit)  # fmt: skip
    record = store.require(envelope.tenant, envelope.request_id)
    result = request_cancel(store, stack.dynamodb, stack.resources.table_name, record, "stop")
    assert result.outcome == "requested"
    return lease


@pytest.mark.parametrize("tenant_limit", [0, 1])
def test_an_attempt_ending_retryable_after_a_cancel_request_ends_cancelled(
    stack: Stack, tenant_limit: int
) -> None:
    store, envelope = _store(stack), _envelope()
    lease = _running_and_flagged(stack, envelope, tenant_limit)
    # The child failed retryably before the next heartbeat could see the flag.
    with pytest.raises(CancelRequested):
        store.end_attempt(lease, TaskState.RETRYING, fields={"error": {"category": "server"}})
    held = store.require(envelope.tenant, envelope.request_id)
    assert held.state is TaskState.PROCESSING and held.lease_token == lease.token
    # The same lease ends it CANCELLED (what the worker does on CancelRequested).
    store.end_attempt(lease, TaskState.CANCELLED, fields={"reason": "cancel requested"})
    final = store.require(envelope.tenant, envelope.request_id)
    assert final.state is TaskState.CANCELLED and final.attempt == 1
    with pytest.raises(CancelRequested):
        # Read back (`finalize`) refuses the same way.
        store.finalize(_running_and_flagged(stack, _envelope(), tenant_limit),
                       TaskState.RETRYING)  # fmt: skip


@pytest.mark.parametrize("state", [TaskState.PENDING, TaskState.RETRYING])
@pytest.mark.parametrize("tenant_limit", [0, 1])
def test_no_new_attempt_starts_on_a_flagged_waiting_task(
    stack: Stack, state: TaskState, tenant_limit: int
) -> None:
    """A task left waiting with the flag (an item written before this rule, or a give-
    back that raced it): the lock refuses it, and the refusal's cancel is idempotent."""
    store, envelope = _store(stack), _envelope()
    store.create(envelope)
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": f"TASK#acme#{envelope.request_id}"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET #state = :state, cancelRequested = :yes, cancelReason = :why",
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={":state": {"S": state.value}, ":yes": {"BOOL": True},
                                   ":why": {"S": "not wanted"}},
    )  # fmt: skip
    with pytest.raises(CancelPending):
        store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3,
                      tenant_limit=tenant_limit)  # fmt: skip
    assert cancel_orphan(store, "acme", envelope.request_id)
    assert cancel_orphan(store, "acme", envelope.request_id)  # again: already terminal
    final = store.require("acme", envelope.request_id)
    assert final.state is TaskState.CANCELLED and final.attempt == 0
    assert final.raw["terminalEvent"]["detailType"] == "Task Cancelled"
    assert final.raw["terminalEvent"]["payload"]["reason"] == "not wanted"


def test_a_redrive_clears_a_cancel_flag_left_by_a_failed_attempt(stack: Stack) -> None:
    """The flag outlives an attempt that ended FAILED; an operator's redrive is a new
    request, which the lock would otherwise refuse."""
    store, envelope = _store(stack), _envelope()
    lease = _running_and_flagged(stack, envelope, 0)
    store.end_attempt(lease, TaskState.FAILED, fields={"error": {"category": "auth"}})
    reset = store.reset_for_redrive("acme", envelope.request_id)
    assert reset is not None and "cancelRequested" not in reset.raw
    again = store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3)
    assert again.attempt == 1
