"""The worker's call counter tells its heartbeat's calls from the rest (the requests
benchmark's heartbeat figure is read from it), counting real boto3 calls against moto."""

from __future__ import annotations

import threading

from conftest import Stack

from agentq.aws import CallCounter


def test_calls_are_counted_in_all_and_per_calling_thread(stack: Stack) -> None:
    counter = CallCounter()
    sqs = counter.attach(stack.aws_clients().get("sqs"))
    url = stack.resources.tier_queues["high"]

    def beat() -> None:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        sqs.list_queues()

    sqs.list_queues()
    thread = threading.Thread(target=beat, name="heartbeat")
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert counter.snapshot() == {"sqs:GetQueueAttributes": 1, "sqs:ListQueues": 2}
    assert counter.snapshot(thread="heartbeat") == {"sqs:GetQueueAttributes": 1,
                                                    "sqs:ListQueues": 1}  # fmt: skip
    assert counter.snapshot(thread="receive") == {}
    assert counter.total() == 3
