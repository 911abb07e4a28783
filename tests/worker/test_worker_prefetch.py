"""Prefetched messages: locked and kept invisible while they wait, given back at drain."""

from __future__ import annotations

import contextlib
import json
import signal
from datetime import datetime
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import (
    new_id,
    queue_counts,
    running_worker,
    send,
    set_visibility_timeout,
    state,
)

from agentq.envelope import TaskEnvelope
from agentq.states import TaskState


@pytest.mark.timeout(240)
def test_a_prefetched_message_waits_invisible_and_goes_back_at_drain(stack: Stack) -> None:
    events = EventLog(stack, skipped_types=True)  # heartbeats skip the save-event rule
    # One slot, and a horizon so long that any recent start buys one prefetched message.
    with running_worker(
        stack,
        MAX_CONCURRENT_CLAUDE="1",
        PREFETCH_HORIZON="60000",
        WARM_CHILDREN="0",
        DRAIN_TIMEOUT="60000",
    ) as worker:
        warm_up = send(stack, "sample-noop")
        events.wait(warm_up.request_id, "Task Completed", timeout=90)
        # Shorter than the wait below: only the heartbeat can keep the waiting one hidden.
        set_visibility_timeout(stack, 2)
        # In one call, so that the worker's receive finds both.
        first, second = (
            TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-sleep",
                         input={"seconds": 20})
            for _ in range(2)
        )  # fmt: skip
        stack.sqs.send_message_batch(
            QueueUrl=stack.resources.queue_url,
            Entries=[
                {"Id": str(n), "MessageBody": e.to_body(),
                 "MessageAttributes": e.message_attributes()}
                for n, e in enumerate((first, second))
            ],
        )  # fmt: skip
        wait_for(
            lambda: (
                events.of(first.request_id, "Task Processing Started")
                or events.of(second.request_id, "Task Processing Started")
            ),
            timeout=60,
            message="one of the two started",
        )
        running, waiting = (
            (first, second) if events.of(first.request_id, "Task Processing Started")
            else (second, first)
        )  # fmt: skip
        wait_for(lambda: queue_counts(stack) == (0, 2), timeout=20, message="both held")
        wait_for(
            lambda: len(events.of(running.request_id, "Task Heartbeat")) >= 8,
            timeout=60,
            message="heartbeats for well past the visibility timeout",
        )
        assert queue_counts(stack) == (0, 2), "the prefetched message stayed invisible"
        assert not events.of(waiting.request_id, "Task Processing Started")
        locked = state(stack, waiting)
        assert locked is not None and locked.state is TaskState.PROCESSING, "locked ahead"
        assert locked.lease_live(), "its lease is renewed while it waits"

        worker.send(signal.SIGTERM)
        wait_for(lambda: queue_counts(stack)[0] == 1, timeout=10, message="given back at drain")
        assert not events.of(running.request_id, "Task Completed"), "it was still running"
        assert not events.of(waiting.request_id, "Task Processing Started")
        assert worker.wait(timeout=60) == 0
    events.wait(running.request_id, "Task Completed", timeout=30)
    assert not events.of(waiting.request_id, "Task Processing Started")
    released = state(stack, waiting)
    assert released is not None and released.state is TaskState.RETRYING
    assert released.attempt == 0, "the attempt it never ran is not counted"
    assert queue_counts(stack) == (1, 0)


@pytest.mark.timeout(240)
def test_a_fresh_worker_leaves_the_long_tasks_it_cannot_start_to_the_next_worker(
    stack: Stack,
) -> None:
    """Two slots per worker and four 20 s tasks. The first worker fills its slots and,
    with nothing ended yet, locks nothing more behind them (it used to take two more at
    its start rate); the second worker, started after, runs the other two at once."""
    events = EventLog(stack)
    env = {"MAX_CONCURRENT_CLAUDE": "2", "PREFETCH_HORIZON": "2000", "WARM_CHILDREN": "0"}
    tasks = [TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-sleep",
                          input={"seconds": 20}) for _ in range(4)]  # fmt: skip

    def started() -> list[TaskEnvelope]:
        return [t for t in tasks if events.of(t.request_id, "Task Processing Started")]

    def completed() -> list[TaskEnvelope]:
        return [t for t in tasks if events.of(t.request_id, "Task Completed")]

    with running_worker(stack, "first", **env) as first:
        stack.sqs.send_message_batch(
            QueueUrl=stack.resources.queue_url,
            Entries=[{"Id": str(n), "MessageBody": t.to_body(),
                      "MessageAttributes": t.message_attributes()}
                     for n, t in enumerate(tasks)],
        )  # fmt: skip
        wait_for(lambda: len(started()) == 2, timeout=60, message="the first worker's two")
        with running_worker(stack, "second", **env) as second:
            wait_for(lambda: len(started()) == 4 or completed(), timeout=120,
                     message="all four started, or one completed")  # fmt: skip
            first_log, second_log = _log(first.output()), _log(second.output())
            waiting = {t.request_id for t in tasks} - {t.request_id for t in started()}
    # The first worker locked nothing behind its full slots: the other two run at once on
    # the second, unless the first received one's fresh copy (it gave the original back)
    # before the second was up, as on a loaded host: a copy stays where it lands
    # (worker.receive.consumer), and that one waits for the first worker's slot.
    (up,) = [r["at"] for r in second_log if r.get("message") == "worker started"]
    kept_copies = {r["requestId"] for r in first_log
                   if r.get("message") == "message received" and r.get("requeuedFrom")
                   and r["at"] < up}  # fmt: skip
    assert waiting <= kept_copies, (waiting, kept_copies)
    assert len(waiting) < 2, "the second worker ran neither of the two at once"


def _log(output: str) -> list[dict[str, Any]]:
    """A worker's JSON log records, each with `at`, its time."""
    records = []
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and "timestamp" in record:
                record["at"] = datetime.strptime(record["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z")
                records.append(record)
    return records
