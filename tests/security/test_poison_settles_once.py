"""Whatever a message holds, it settles once: in the real worker and the real DLQ
processor, through moto (Hypothesis generates the messages; see security_support)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Stack
from hypothesis import HealthCheck, Phase, example, given, settings
from security_support import HOSTILE, Hostile
from support import EventLog, wait_for

from agentq.dlq import DlqArchive
from agentq.local.lambda_host import local_context, sqs_lambda_record
from agentq.local.workers import WorkerProcess, fast_env
from lambdas import dlq_processor

pytestmark = pytest.mark.timeout(600)

TERMINAL = ("Task Completed", "Task Failed", "Task Cancelled")
# One real worker serves every example, so the fixture outlives them on purpose. No
# shrinking: a message that failed to settle stays in the queue and would fail every
# replay after it, so the first failing example is the one to report.
SHARED = settings(max_examples=30, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])  # fmt: skip
# The poison first seen in the field, every run.
REPRODUCED = [
    Hostile("envelope", "sample-noop", "acme", "same", {"x": float("inf")}, 0, "String", "x"),
    Hostile("envelope", "sample-noop", "acme", "same", {"x": float("nan")}, 0, "String", "x"),
    Hostile("envelope", "sample-noop", "acme", "same", {}, 10_000, "String", "x"),
    Hostile("envelope", "sample-noop", "acme", "same", {"x": "\ud800"}, 0, "String", "x"),
    Hostile("envelope", "sample-noop", "acme", "same", {}, 0, "Number", "x"),
    # An empty map key: DynamoDB refuses it, moto stored it mangled and the DLQ
    # processor's second delivery could not read the record back.
    Hostile("envelope", "no-such-def", "acme", "same", {"j": {}, "": {}}, 0, None, "x"),
    # A notBefore DynamoDB cannot store: every receive and every DLQ delivery failed.
    Hostile("envelope", "sample-noop", "acme", "same", {}, 0, "String", "x", 1e200),
    # After the year 9999: stored, then every read of the task failed.
    Hostile("envelope", "sample-noop", "acme", "same", {}, 0, "String", "x", 3e14),
]


def _with_reproduced(test: Callable[[Hostile], None]) -> Callable[[Hostile], None]:
    for shape in REPRODUCED:
        test = example(shape=shape)(test)
    return test


def _counts(stack: Stack, url: str) -> tuple[int, int]:
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]))  # fmt: skip


def _receive(stack: Stack, url: str, message_id: str) -> dict[str, Any] | None:
    """This example's message; any other (an earlier example's, if it failed) is deleted
    so it cannot fail the examples after it."""
    for message in stack.sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
        AttributeNames=["All"], MessageAttributeNames=["All"],
    ).get("Messages", []):  # fmt: skip
        if message["MessageId"] == message_id:
            return dict(message)
        stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return None


def _terminal(events: EventLog, request_id: str, message_id: str) -> list[dict[str, Any]]:
    """Terminal events of this example: under its request id, or its message id when
    the rejection could not read one."""
    events.poll()
    return [
        e for e in events.events
        if e["detail-type"] in TERMINAL
        and (e.get("requestId") == request_id
             or (e.get("payload") or {}).get("messageId") == message_id)
    ]  # fmt: skip


@pytest.fixture
def worker(stack: Stack) -> Iterator[WorkerProcess]:
    process = WorkerProcess("poison").start({**stack.env(), **fast_env()})
    try:
        yield process
    except BaseException:
        print(f"--- worker output ---\n{process.output()[-6000:]}")
        raise
    finally:
        process.kill()


def test_the_worker_settles_every_message_in_one_receive(
    stack: Stack, worker: WorkerProcess
) -> None:
    events = EventLog(stack)

    @SHARED
    @given(shape=HOSTILE)
    @_with_reproduced
    def one(shape: Hostile) -> None:
        request_id = "p-" + uuid.uuid4().hex[:12]
        body, attributes, _ = shape.build(request_id)
        message_id = stack.sqs.send_message(
            QueueUrl=stack.resources.queue_url, MessageBody=body, MessageAttributes=attributes
        )["MessageId"]

        def settled() -> list[dict[str, Any]]:
            return [r for r in worker.log_records()
                    if r.get("message") == "message settled" and r.get("messageId") == message_id]  # fmt: skip

        verdicts = wait_for(settled, timeout=60, message=f"{message_id} settled")
        wait_for(lambda: _counts(stack, stack.resources.queue_url) == (0, 0), timeout=30,
                 message="the message deleted")  # fmt: skip
        ended = wait_for(lambda: _terminal(events, request_id, message_id), timeout=30,
                         message="a terminal event")  # fmt: skip
        assert worker.alive(), worker.output()[-3000:]
        assert [v["verdict"] for v in verdicts] in (["rejected"], ["completed"]), verdicts
        assert len({e["eventId"] for e in ended}) == 1, ended
        if ended[0]["detail-type"] == "Task Failed":
            error = ended[0]["payload"]["error"]
            assert error["category"] in ("validation", "parse", "not_found"), error
            assert error["message"], error

    one()
    assert "message handling failed" not in worker.output()
    assert _counts(stack, stack.resources.dlq_url) == (0, 0)


def test_the_dlq_processor_closes_out_every_dead_letter_once(stack: Stack) -> None:
    events = EventLog(stack)
    archive = DlqArchive(stack.s3, stack.resources.bucket)
    url = stack.resources.dlq_url

    @SHARED
    @given(shape=HOSTILE)
    @_with_reproduced
    def one(shape: Hostile) -> None:
        request_id = "d-" + uuid.uuid4().hex[:12]
        body, attributes, readable = shape.build(request_id)
        message_id = stack.sqs.send_message(
            QueueUrl=url, MessageBody=body, MessageAttributes=attributes
        )["MessageId"]
        mine = wait_for(lambda: _receive(stack, url, message_id), timeout=20,
                        message="the dead letter received")  # fmt: skip
        event = {"Records": [sqs_lambda_record(mine, queue_arn=stack.resources.dlq_arn)]}

        # Delivered twice (Lambda's at-least-once): one close-out, one archive.
        for _ in range(2):
            response = dlq_processor.handler(event, local_context("dlq-processor"))
            assert response == {"batchItemFailures": []}
        stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=mine["ReceiptHandle"])

        keys = [k for k in archive.keys() if k.endswith(f"/{message_id}.json")]  # noqa: SIM118
        assert len(keys) == 1, keys
        ended = [e for e in _terminal(events, request_id, message_id)
                 if e.get("requestId") == request_id]  # fmt: skip
        # A redelivery may re-send the stored terminal event: the same event (same id),
        # which save-event and the dispatcher deduplicate, never a second ending.
        assert len({e["eventId"] for e in ended}) <= 1, ended
        if archive.get(keys[0]).outcome == "returned":
            # A valid message whose task never ran goes back to the task queue (once
            # counted, agentq/dlq/returns.py): it has not ended, a worker will settle it.
            assert not ended, ended
        elif readable:
            assert ended, (archive.get(keys[0]), ended)

    one()
    assert _counts(stack, url) == (0, 0)
