"""A settled message stays the worker's until its delete is sent."""

from __future__ import annotations

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, set_visibility_timeout


@pytest.mark.timeout(180)
def test_a_finished_task_is_not_received_again_while_its_event_and_delete_wait(
    stack: Stack,
) -> None:
    events = EventLog(stack)
    set_visibility_timeout(stack, 1)
    # Events wait 4 s for companions; one visibility extension lasts 1 s. Without the
    # heartbeat covering the wait, the message would come back before it is deleted.
    with running_worker(
        stack,
        EVENT_BATCH_WINDOW="4000",
        VISIBILITY_EXTENSION_AMOUNT="1",
        VISIBILITY_EXTENSION_INTERVAL="200",
        WAIT_TIME_SECONDS="1",
    ) as worker:
        task = send(stack, "sample-echo", {"n": 1})
        events.wait(task.request_id, "Task Completed", timeout=90)
        wait_for(lambda: queue_counts(stack) == (0, 0), timeout=30, message="message deleted")
        worker.stop()
    stats = worker.stats()
    assert stats is not None
    assert stats["received"] == 1, stats
    assert stats["verdicts"] == {"completed": 1}
