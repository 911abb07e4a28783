"""A shutdown's release of a running attempt: its number is spent, its budget is not.

A drain that times out stops the running child and releases its task RETRYING. The
child had started, so its attempt number was handed to task code (with the lease
token, its fencing token) and named in `Task Processing Started`: the STATE item must
never go back below it. A cancel answered "cancelled at attempt 0" after attempt 1 had
run was the scheduling chaos run's finding (issue 38). The release must not cost the
task an attempt of its budget either (a rolling deploy is not the task's failure), so
the lock admits one more attempt per release.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Stack
from support import wait_for
from worker_parts import LONG_LEASE, Parts, worker_parts

from agentq.envelope import TaskEnvelope
from agentq.errors import AttemptsExhausted
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store.tenants import TenantLimitStore
from worker.inflight import InFlight
from worker.settle.prepare import Prepared

pytestmark = pytest.mark.timeout(120)


def _received(stack: Stack, tenant: str) -> tuple[TaskEnvelope, dict[str, object], InFlight]:
    envelope = TaskEnvelope(request_id=f"rel-{uuid.uuid4().hex[:12]}", tenant=tenant,
                            definition="sample-sleep", input={"seconds": 60})  # fmt: skip
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=envelope.to_body(),
                           MessageAttributes=envelope.message_attributes())  # fmt: skip
    [message] = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, WaitTimeSeconds=5,
        MessageAttributeNames=["All"], AttributeNames=["All"],
    )["Messages"]  # fmt: skip
    entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"],
                     message=message)  # fmt: skip
    return envelope, message, entry


def _release_while_running(
    parts: Parts, stack: Stack, *, max_attempts: int, tenant: str = "acme"
) -> TaskEnvelope:
    """Lock a task, start its child, then stop it as a timed-out drain does."""
    envelope, message, entry = _received(stack, tenant)
    parts.inflight.add(entry)
    prepared = parts.handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)
    prepared = dataclasses.replace(prepared, max_attempts=max_attempts)
    with ThreadPoolExecutor(1) as pool:
        handled = pool.submit(parts.handler.handle, message, entry=entry, prepared=prepared)
        wait_for(lambda: entry.child_pid is not None or handled.done(), timeout=30,
                 message="the task's child started")  # fmt: skip
        assert entry.child_pid is not None, handled.result()
        entry.stop.set("shutdown")  # the drain's deadline passed
        assert handled.result(timeout=60) == "released"
    assert parts.batcher.flush()
    return envelope


def test_a_released_attempt_keeps_its_number(stack: Stack) -> None:
    parts = worker_parts(stack, env=LONG_LEASE)
    envelope = _release_while_running(parts, stack, max_attempts=3)

    record = parts.store.require("acme", envelope.request_id)
    started = [event.attempt for event in parts.sink.of("Task Processing Started")]
    assert started == [1]
    assert record.state is TaskState.RETRYING
    # Never below an attempt whose child started: a cancel now is answered at attempt 1.
    assert record.attempt == 1
    lease = parts.store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=3)
    assert lease.attempt == 2  # the next attempt has a number of its own


def test_a_released_last_attempt_still_runs_again(stack: Stack) -> None:
    """Released on its only attempt: the task is locked once more, then no more."""
    parts = worker_parts(stack, env=LONG_LEASE)
    envelope = _release_while_running(parts, stack, max_attempts=1)

    lease = parts.store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=1)
    assert lease.attempt == 2
    assert lease.attempt_budget(1) == 2  # what decides between a retry and FAILED
    parts.store.end_attempt(lease, TaskState.RETRYING)
    with pytest.raises(AttemptsExhausted):
        parts.store.acquire(envelope, worker_id="w3", lease_seconds=30, max_attempts=1)


def test_a_released_attempt_of_a_limited_tenant_keeps_its_number_and_budget(
    stack: Stack,
) -> None:
    """The same through the seated lock (a transaction, which returns no item)."""
    tenant = f"rel-{uuid.uuid4().hex[:8]}"
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set(tenant, 1)
    parts = worker_parts(stack, env=LONG_LEASE)
    envelope = _release_while_running(parts, stack, max_attempts=1, tenant=tenant)

    record = parts.store.require(tenant, envelope.request_id)
    assert (record.state, record.attempt) == (TaskState.RETRYING, 1)
    lease = parts.store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=1,
                                tenant_limit=1)  # fmt: skip
    assert (lease.attempt, lease.attempt_budget(1), lease.seat) == (2, 2, 0)


@pytest.mark.parametrize("reset", ["retry", "redrive"])
def test_an_operators_fresh_start_clears_the_allowance(stack: Stack, reset: str) -> None:
    """A retry or redrive starts again at attempt 0 with the definition's budget alone."""
    parts = worker_parts(stack, env=LONG_LEASE)
    envelope = _release_while_running(parts, stack, max_attempts=1)
    lease = parts.store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=1)
    parts.store.end_attempt(lease, TaskState.FAILED)

    if reset == "retry":
        record = parts.store.reset_for_retry("acme", envelope.request_id, write_id="op-1")
    else:
        record = parts.store.reset_for_redrive("acme", envelope.request_id)

    assert record is not None and (record.attempt, record.attempt_allowance) == (0, 0)


def test_a_last_attempt_whose_lease_ran_short_before_its_child_started_runs_again(
    stack: Stack,
) -> None:
    """Renewals failed while the task waited for its slot, so the slot found its lease
    about to lapse and started no child. Nothing ran: the task must not end FAILED
    `LeaseFenced` on its only attempt with no execution (the faults chaos run's finding,
    issue 38); it is released like a drain's stop, and runs again."""
    parts = worker_parts(stack)
    envelope, message, entry = _received(stack, "acme")
    parts.inflight.add(entry)
    prepared = parts.handler.prepare(message, entry)
    assert isinstance(prepared, Prepared)
    prepared = dataclasses.replace(prepared, max_attempts=1)
    lease = entry.stop.lease
    assert lease is not None
    # The last renewal that succeeded is long ago: the fence is already behind us.
    entry.stop.lease = dataclasses.replace(lease, fence_at_ms=now_ms() - 1_000)

    assert parts.handler.handle(message, entry=entry, prepared=prepared) == "released"
    assert entry.child_pid is None  # no child, so no task code ran
    assert parts.batcher.flush()

    record = parts.store.require("acme", envelope.request_id)
    assert (record.state, record.attempt) == (TaskState.RETRYING, 1)
    [failed] = parts.sink.of("Task Processing Failed")
    assert failed.payload["error"]["exception_type"] == "LeaseFenced"
    assert not parts.sink.of("Task Failed")
    # The message is back as a fresh copy (its receive count starts again) ...
    copies = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=5,
                                       AttributeNames=["All"])["Messages"]  # fmt: skip
    assert [c["Attributes"]["ApproximateReceiveCount"] for c in copies] == ["1"]
    assert json.loads(copies[0]["Body"])["requestId"] == envelope.request_id
    # ... and the task may be locked once more within its budget of one.
    again = parts.store.acquire(envelope, worker_id="w2", lease_seconds=30, max_attempts=1)
    assert (again.attempt, again.attempt_budget(1)) == (2, 2)
