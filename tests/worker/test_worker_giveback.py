"""A drain gives messages back within its deadline, and without spending receives.

The consumer's give-back, on a worker built in-process against moto: preparations that
never finish (DynamoDB unreachable, say) must not hold the drain for a minute each, and
one not begun is cancelled rather than waited for. What is given back (prefetched, or
released by a drain that timed out) is requeued as a fresh copy: only real attempts
may bring a task to the dead-letter queue.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import wait_for
from worker_support import queue_counts, receive_all, running_worker, send, state

from agentq.config import Settings
from agentq.local.workers import REPO_ROOT, SAMPLE_DEFINITIONS, WorkerProcess
from agentq.states import TaskState
from bench.stack import BENCH_DEFINITIONS
from worker.app import build
from worker.inflight import InFlight
from worker.receive.placement import Held
from worker.sqs.batcher import SqsBatcher


@pytest.mark.timeout(120)
def test_a_drain_gives_back_stuck_preparations_by_its_deadline(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    worker = build(Settings.from_env())
    consumer = worker.consumer
    for n in range(3):
        inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url, MessageBody=str(n))
    messages = receive_all(inproc_stack, 3)
    stuck: list[Future[Any]] = [Future(), Future()]
    for future in stuck:
        future.set_running_or_notify_cancel()  # locking, and never answering
    not_begun: Future[Any] = Future()
    held: list[Held] = []
    for message, preparation in zip(messages, [*stuck, not_begun], strict=True):
        entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"])
        consumer._inflight.add(entry)
        held.append((message, entry, preparation))
    try:
        began = time.monotonic()
        consumer._give_back(held, deadline=time.monotonic() + 1.0)
        # Waiting on each stuck preparation in turn would take 2 x 60 s.
        assert time.monotonic() - began < 20
        assert not_begun.cancelled()
        assert not consumer._inflight.snapshot(), "nothing is kept invisible any more"
        back = receive_all(inproc_stack, 3)
        # Requeued as fresh copies (new ids, receive count 1 again): a give-back ran no
        # attempt, so it must not spend one of the queue's receives.
        assert sorted(m["Body"] for m in back) == sorted(m["Body"] for m in messages)
        assert not {m["MessageId"] for m in back} & {m["MessageId"] for m in messages}
    finally:
        for future in stuck:
            future.set_result(None)
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(240)
def test_a_shutdown_release_spends_no_receive(stack: Stack, tmp_path: Path) -> None:
    """Released, failed, failed, then it succeeds: three real attempts, never the DLQ.

    The queue dead-letters on the fourth receive. A release that gave the message back
    in place spent one, so the third attempt's receive was its fourth: dead-lettered
    with an attempt left. A release requeues a fresh copy instead. The released
    attempt keeps its number (1) and costs no budget: attempts 2 to 4 are the three.
    """
    side_log = tmp_path / "runs.jsonl"
    # Fails on attempts 1 to 3 (the first is released before it can): attempt 4 runs
    # only if the release cost no attempt of the task's budget (3).
    payload = {"seconds": 2, "mode": "flaky", "fail_times": 3, "side_log": str(side_log)}
    with running_worker(stack, "leaving", **_bench_env(DRAIN_TIMEOUT="200")) as leaving:
        task = send(stack, "bench-work", payload)
        wait_for(lambda: _ended(side_log) or _started(side_log), timeout=60,
                 message="the first run started")  # fmt: skip
        leaving.send(signal.SIGTERM)  # the drain times out: the run is stopped and released
        assert leaving.wait(60) == 3, leaving.output()[-3000:]
    assert "released" in _verdicts(leaving)
    with running_worker(stack, "staying", **_bench_env()) as staying:
        wait_for(
            lambda: (
                _finished(stack, task) or queue_counts(stack, stack.resources.dlq_url) != (0, 0)
            ),
            timeout=120,
            message="the task finished or was dead-lettered",
        )
        staying.stop()
    assert queue_counts(stack, stack.resources.dlq_url) == (0, 0), "dead-lettered"
    record = state(stack, task)
    assert record is not None and record.state is TaskState.COMPLETED, record
    assert record.attempt == 4
    assert _verdicts(staying) == ["retrying", "retrying", "completed"]


def _bench_env(**overrides: str) -> dict[str, str]:
    paths = (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
    return {
        "TASK_DEFINITIONS_DIR": os.pathsep.join([str(BENCH_DEFINITIONS), str(SAMPLE_DEFINITIONS)]),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        **overrides,
    }


def _lines(side_log: Path) -> list[dict[str, Any]]:
    if not side_log.exists():
        return []
    return [json.loads(line) for line in side_log.read_text().splitlines() if line.strip()]


def _started(side_log: Path) -> bool:
    return any(r["event"] == "start" for r in _lines(side_log))


def _ended(side_log: Path) -> bool:
    return any(r["event"] == "end" for r in _lines(side_log))


def _finished(stack: Stack, task: Any) -> bool:
    record = state(stack, task)
    return record is not None and record.state.terminal


def _verdicts(worker: WorkerProcess) -> list[str]:
    return [str(r.get("verdict")) for r in worker.log_records()
            if r.get("message") == "message settled"]  # fmt: skip


@pytest.mark.timeout(60)
def test_a_give_back_sends_a_copy_then_deletes_or_else_gives_back_in_place(
    inproc_stack: Stack,
) -> None:
    sqs, url = inproc_stack.sqs, inproc_stack.resources.queue_url
    attributes = {"requestId": {"DataType": "String", "StringValue": "r-give"}}
    sqs.send_message(QueueUrl=url, MessageBody='{"b": 1}', MessageAttributes=attributes)

    def receive() -> dict[str, Any]:
        [message] = wait_for(
            lambda: sqs.receive_message(
                QueueUrl=url, VisibilityTimeout=300, MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ).get("Messages"),
            timeout=10, message="the message back on the queue",
        )  # fmt: skip
        return dict(message)

    batcher = SqsBatcher(sqs, url, delay_s=0)
    try:
        first = receive()
        batcher.give_back(first["ReceiptHandle"], first)
        batcher.flush()
        copy = receive()
        assert copy["MessageId"] != first["MessageId"], "a fresh copy"
        assert copy["Body"] == first["Body"]
        assert copy["MessageAttributes"]["requestId"]["StringValue"] == "r-give"
        assert copy["Attributes"]["ApproximateReceiveCount"] == "1", "no receive spent"
        assert copy["MessageAttributes"]["requeuedFrom"]["StringValue"] == first["MessageId"]

        def refuse(**_: Any) -> None:
            raise RuntimeError("SendMessage denied")

        # The copy cannot be sent (throttled past retries, or denied): back in place.
        sqs.meta.events.register("before-call.sqs.SendMessageBatch", refuse)
        try:
            batcher.give_back(copy["ReceiptHandle"], copy)
            batcher.flush()
        finally:
            sqs.meta.events.unregister("before-call.sqs.SendMessageBatch", refuse)
        again = receive()
        assert again["MessageId"] == copy["MessageId"]
        assert again["Attributes"]["ApproximateReceiveCount"] == "2"
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages") is None
    finally:
        batcher.close()


@pytest.mark.timeout(60)
def test_a_message_received_while_draining_is_requeued_fresh(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    consumer = build(Settings.from_env()).consumer
    inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url, MessageBody="late")
    [message] = receive_all(inproc_stack, 1)
    try:
        consumer._stopping.set()  # the long poll that brought it ended after the drain began
        consumer._accept(message, Settings.from_env().default_priority)
        consumer._batcher.flush()
        [back] = receive_all(inproc_stack, 1)
        assert back["Body"] == "late" and back["MessageId"] != message["MessageId"]
        assert consumer.received == 0 and not consumer._inflight.snapshot()
    finally:
        consumer._batcher.close()
        consumer._events.close()


@pytest.mark.timeout(60)
def test_a_copy_of_a_copy_names_its_latest_and_a_full_attribute_set_stays_whole(
    inproc_stack: Stack,
) -> None:
    """The lineage attribute names the message a copy replaces, never an older one, and a
    foreign sender's ten attributes (SQS's limit) are requeued without it, not refused."""
    sqs, url = inproc_stack.sqs, inproc_stack.resources.queue_url
    full = {f"a{n}": {"DataType": "String", "StringValue": str(n)} for n in range(10)}
    sqs.send_message(QueueUrl=url, MessageBody="lineage")

    def receive(body: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            match = None
            for message in sqs.receive_message(
                QueueUrl=url,
                VisibilityTimeout=300,
                MessageAttributeNames=["All"],
                MaxNumberOfMessages=10,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", []):
                if message["Body"] == body and match is None:
                    match = dict(message)
                    continue
                # Not the one wanted: visible again at once for a later receive.
                sqs.change_message_visibility(
                    QueueUrl=url, VisibilityTimeout=0, ReceiptHandle=message["ReceiptHandle"]
                )
            return match

        return wait_for(found, timeout=10, message=f"{body!r} on the queue")

    batcher = SqsBatcher(sqs, url, delay_s=0)
    try:
        first = receive("lineage")
        batcher.give_back(first["ReceiptHandle"], first)
        batcher.flush()
        copy = receive("lineage")
        batcher.give_back(copy["ReceiptHandle"], copy)
        batcher.flush()
        second = receive("lineage")
        assert second["MessageAttributes"]["requeuedFrom"]["StringValue"] == copy["MessageId"]
        assert second["Attributes"]["ApproximateReceiveCount"] == "1"

        # Sent only now: each receive above would have spent one of its receives.
        sqs.send_message(QueueUrl=url, MessageBody="full", MessageAttributes=full)
        crowded = receive("full")
        batcher.give_back(crowded["ReceiptHandle"], crowded)
        batcher.flush()
        again = receive("full")
        assert again["MessageId"] != crowded["MessageId"], "a fresh copy, not in place"
        assert set(again["MessageAttributes"]) == set(full)
        assert again["Attributes"]["ApproximateReceiveCount"] == "1"
    finally:
        batcher.close()
