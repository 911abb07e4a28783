"""A real worker process under AGENTQ_FAULTS: the environment reaches its clients, and
a task whose lock and final write meet faults still runs once (issue 14, defects 1, 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Stack
from fault_support import drain_bodies, unique_seed
from support import wait_for
from worker_parts import worker_parts

from agentq.envelope import TaskEnvelope
from agentq.faults.log import read_counts
from agentq.local.workers import WorkerProcess, fast_env
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from worker.child.runner import load_context

pytestmark = pytest.mark.timeout(180)


@pytest.mark.e2e
def test_a_task_whose_lock_and_final_write_meet_faults_runs_once(
    stack: Stack, tmp_path: Path
) -> None:
    log = tmp_path / "faults.jsonl"
    spec = {
        "rules": [
            # The lock is applied, its answer lost: botocore's retry meets the new lease.
            {"op": "dynamodb:UpdateItem", "kind": "applied_then_failed", "rate": 1,
             "limit": 1, "match": "startedAt"},
            # The final write conflicts with the heartbeat's renewal transaction, twice.
            {"op": "dynamodb:UpdateItem", "kind": "transaction_conflict", "rate": 1,
             "limit": 2, "match": "finishedAt"},
            {"op": "*", "kind": "throttle", "rate": 0.05},
        ]
    }  # fmt: skip
    # Leases of 12 s renewed every second. With fast_env's 3 s a CI run on a loaded
    # machine ended this task at attempt 2; its worker log was not kept (it is now, in
    # the assertion), and the one path to that we found is a heartbeat stalled past the
    # lease: the child fenced and run again, correct but beside what this test is about.
    env = {**stack.env(), **fast_env(), "AGENTQ_FAULTS": json.dumps(spec),
           "AGENTQ_FAULTS_SEED": unique_seed(), "AGENTQ_FAULTS_LOG": str(log),
           "VISIBILITY_EXTENSION_AMOUNT": "8", "VISIBILITY_EXTENSION_INTERVAL": "1000"}  # fmt: skip
    envelope = TaskEnvelope(request_id="pf-" + unique_seed(), tenant="acme",
                            definition="sample-echo", input={"text": "hi"})  # fmt: skip
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    endings: list[str] = []

    def ended() -> list[str]:
        endings.extend(
            b["detail-type"]
            for b in drain_bodies(stack, stack.resources.target_queues["save-event"])
            if b["detail"].get("requestId") == envelope.request_id
            and b["detail-type"] in ("Task Completed", "Task Failed", "Task Timeout")
        )
        return endings

    worker = WorkerProcess("faulty")
    worker.start(env)
    try:
        wait_for(ended, timeout=90, message="the task's terminal event")
        worker.stop(timeout=60)  # a drain flushes whatever is still batched
    except BaseException:
        print(f"--- worker output ---\n{worker.output()[-6000:]}")
        raise
    finally:
        if worker.alive():
            worker.kill()

    assert ended() == ["Task Completed"]
    record = store.require(envelope.tenant, envelope.request_id)
    assert (record.state, record.attempt) == (TaskState.COMPLETED, 1), worker.output()[-12000:]
    counts = read_counts(str(log))
    assert counts["dynamodb:UpdateItem:applied_then_failed"] == 1
    assert counts["dynamodb:UpdateItem:transaction_conflict"] == 2


def test_task_code_gets_the_attempt_and_lease_token_as_its_fencing_token(stack: Stack) -> None:
    parts = worker_parts(stack)
    envelope = TaskEnvelope(
        request_id="ft-" + unique_seed(), tenant="acme", definition="sample-echo"
    )
    lease = parts.store.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    definition = parts.handler._preparer._registry.get("sample-echo")
    task_dir, _ = parts.handler._write_task(envelope, definition, lease)
    ctx = load_context(task_dir)
    assert (ctx.attempt, ctx.lease_token) == (1, lease.token)
    assert ctx.fencing_token == f"1:{lease.token}"


@pytest.mark.e2e
def test_a_worker_under_a_five_percent_mix_ends_each_task_once(
    stack: Stack, tmp_path: Path
) -> None:
    log = tmp_path / "faults.jsonl"
    env = {**stack.env(), **fast_env(), "AGENTQ_FAULTS": "mix@0.05",
           "AGENTQ_FAULTS_SEED": unique_seed(), "AGENTQ_FAULTS_LOG": str(log)}  # fmt: skip
    envelopes = [
        TaskEnvelope(
            request_id=f"mx-{n}-{unique_seed()}",
            tenant="acme",
            definition="sample-echo",
            input={"n": n},
        )
        for n in range(12)
    ]
    for envelope in envelopes:
        stack.sqs.send_message(
            QueueUrl=stack.resources.queue_url,
            MessageBody=envelope.to_body(),
            MessageAttributes=envelope.message_attributes(),
        )
    # A lost ReceiveMessage answer (applied_then_failed) hides its messages for the
    # queue's visibility timeout, as on AWS: keep it short so they come back in time.
    stack.sqs.set_queue_attributes(
        QueueUrl=stack.resources.queue_url, Attributes={"VisibilityTimeout": "5"}
    )
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    ids = {e.request_id for e in envelopes}
    endings: dict[str, set[str]] = {}

    def all_ended() -> bool:
        for body in drain_bodies(stack, stack.resources.target_queues["save-event"]):
            detail = body["detail"]
            if detail.get("requestId") in ids and body["detail-type"] in (
                "Task Completed", "Task Failed", "Task Timeout"
            ):  # fmt: skip
                endings.setdefault(detail["requestId"], set()).add(detail["eventId"])
        return set(endings) == ids

    worker = WorkerProcess("mixed")
    worker.start(env)
    try:
        wait_for(all_ended, timeout=150, message="every task's terminal event")
        worker.stop(timeout=60)
    except BaseException:
        print(f"--- worker output ---\n{worker.output()[-6000:]}")
        raise
    finally:
        if worker.alive():
            worker.kill()
    all_ended()

    # One terminal event per task (a re-sent one keeps its id), matching its STATE item.
    assert {rid: len(events) for rid, events in endings.items()} == dict.fromkeys(ids, 1)
    for envelope in envelopes:
        record = store.require(envelope.tenant, envelope.request_id)
        assert record.state is TaskState.COMPLETED
        assert record.raw["terminalEvent"]["eventId"] in endings[envelope.request_id]
    assert sum(read_counts(str(log)).values()) > 0
