"""Back-offs must not spend the receives SQS allows before it dead-letters a message."""

from __future__ import annotations

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state, store

from agentq.states import TaskState
from agentq.store.tasks import Lease


@pytest.mark.timeout(180)
def test_a_task_held_by_a_dead_worker_is_taken_over_not_dead_lettered(stack: Stack) -> None:
    events = EventLog(stack)
    task = send(stack, "sample-echo", {"after": "takeover"})
    # A worker took the task and died: its lease runs out in 15 s.
    lease: Lease = store(stack).acquire(
        task, worker_id="dead-worker", lease_seconds=15, max_attempts=3
    )
    # Two receives are already spent (the dead worker's and a lapse); with the queue's
    # maxReceiveCount of 3 one more back-off in place would dead-letter the message.
    for _ in range(2):
        received = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=2)[
            "Messages"
        ]
        stack.sqs.change_message_visibility(
            QueueUrl=stack.resources.queue_url,
            ReceiptHandle=received[0]["ReceiptHandle"],
            VisibilityTimeout=0,
        )
    with running_worker(stack) as worker:
        completed = events.wait(task.request_id, "Task Completed", timeout=90)[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), timeout=30, message="message deleted")
        worker.stop()
    assert completed["attempt"] == lease.attempt + 1
    assert queue_counts(stack, stack.resources.dlq_url) == (0, 0), "nothing dead-lettered"
    record = state(stack, task)
    assert record is not None and record.state is TaskState.COMPLETED
    assert "requeued" in worker.output(), "the back-off requeued a fresh copy"
