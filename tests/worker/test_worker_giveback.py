"""A drain gives prefetched messages back within its deadline, whatever their locks do.

The consumer's give-back, on a worker built in-process against moto: preparations that
never finish (DynamoDB unreachable, say) must not hold the drain for a minute each, and
one not begun is cancelled rather than waited for.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest
from conftest import Stack
from support import wait_for

from agentq.config import Settings
from worker.app import build
from worker.inflight import InFlight
from worker.intake import Held

pytestmark = pytest.mark.timeout(120)


def _receive_all(stack: Stack, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    def received() -> bool:
        reply = stack.sqs.receive_message(
            QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=300
        )
        got.extend(reply.get("Messages", []))
        return len(got) >= count

    wait_for(received, timeout=30, message=f"{count} messages received")
    return got


def test_a_drain_gives_back_stuck_preparations_by_its_deadline(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARM_CHILDREN", "false")
    monkeypatch.setenv("SQS_BATCH_WINDOW", "0")
    worker = build(Settings.from_env())
    consumer = worker.consumer
    for n in range(3):
        inproc_stack.sqs.send_message(QueueUrl=inproc_stack.resources.queue_url, MessageBody=str(n))
    messages = _receive_all(inproc_stack, 3)
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
        back = _receive_all(inproc_stack, 3)
        # Requeued as fresh copies (new ids, receive count 1 again): a give-back ran no
        # attempt, so it must not spend one of the queue's receives.
        assert sorted(m["Body"] for m in back) == sorted(m["Body"] for m in messages)
        assert not {m["MessageId"] for m in back} & {m["MessageId"] for m in messages}
    finally:
        for future in stuck:
            future.set_result(None)
        consumer._batcher.close()
        consumer._events.close()
