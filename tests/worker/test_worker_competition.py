"""Competing workers, crashes, long tasks and shutdown, with real processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import (
    queue_counts,
    running_worker,
    send,
    set_visibility_timeout,
    state,
    store,
)

from agentq.events import now_ms
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(150)


def _runs(side_log: Path) -> list[dict[str, object]]:
    if not side_log.exists():
        return []
    return [json.loads(line) for line in side_log.read_text().splitlines()]


def test_worker_two_workers_one_message_runs_once(stack: Stack, tmp_path: Path) -> None:
    # The message becomes visible again (1 s) well before its first extension (2.5 s), so
    # the other worker receives the very same message while the task runs. One slot each:
    # the worker running the task cannot receive its own message back.
    set_visibility_timeout(stack, 1)
    events = EventLog(stack)
    side_log = tmp_path / "runs.jsonl"
    slow_beat = {
        "VISIBILITY_EXTENSION_INTERVAL": "2500",
        "VISIBILITY_EXTENSION_AMOUNT": "3",
        "MAX_CONCURRENT_CLAUDE": "1",
    }
    with (
        running_worker(stack, "a", **slow_beat) as first,
        running_worker(stack, "b", **slow_beat) as second,
    ):
        # Both must be receiving before the message is sent: the loser's only chance to
        # see it is the 1.5 s between its first reappearance and its first extension.
        for worker in (first, second):
            worker.wait_for_output("worker started", timeout=60)
        task = send(stack, "sample-sleep", {"seconds": 4, "side_log": str(side_log)})
        events.wait(task.request_id, "Task Completed", timeout=60)
        wait_for(lambda: queue_counts(stack) == (0, 0), timeout=60, message="message gone")
        first.stop()
        second.stop()
    assert len(_runs(side_log)) == 1
    assert len(events.of(task.request_id, "Task Processing Started")) == 1
    # The loser may find the finished task before its message is deleted and re-send its
    # terminal event: the same event (same id), which consumers deduplicate.
    completed = events.of(task.request_id, "Task Completed")
    assert len({e["eventId"] for e in completed}) == 1
    verdicts: dict[str, int] = {}
    for worker in (first, second):
        stats = worker.stats()
        assert stats is not None
        for verdict, count in stats["verdicts"].items():
            verdicts[verdict] = verdicts.get(verdict, 0) + count
    assert verdicts.get("completed") == 1
    # The loser saw a live lease and left the message alone (it never deleted it).
    assert verdicts.get("held_elsewhere", 0) >= 1


def test_worker_killed_mid_task_is_taken_over_after_the_lease_expires(
    stack: Stack, tmp_path: Path
) -> None:
    set_visibility_timeout(stack, 3)
    events = EventLog(stack)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack, "doomed") as doomed:
        task = send(stack, "sample-sleep", {"seconds": 3, "side_log": str(side_log)})
        # The lock, read straight from the table: the started event's way through the
        # bus can take longer than the task's 3 s on a loaded machine.
        wait_for(lambda: (r := state(stack, task)) is not None and r.state is TaskState.PROCESSING,
                 timeout=30, message="the first attempt holds the task")  # fmt: skip
        doomed.kill()
    record = state(stack, task)
    assert record is not None and record.state is TaskState.PROCESSING
    wait_for(
        lambda: (r := state(stack, task)) is not None and not r.lease_live(now_ms()),
        timeout=20,
        message="the dead worker's lease expires",
    )
    with running_worker(stack, "heir") as heir:
        events.wait(task.request_id, "Task Completed")
        wait_for(lambda: queue_counts(stack) == (0, 0), timeout=30, message="message deleted")
        heir.stop()
    runs = _runs(side_log)
    assert len(runs) == 1 and runs[0]["attempt"] == 2
    assert len(events.of(task.request_id, "Task Completed")) == 1
    final = state(stack, task)
    assert final is not None and final.state is TaskState.COMPLETED and final.attempt == 2


def test_worker_heartbeat_keeps_a_long_task_invisible(stack: Stack) -> None:
    # Visibility 2 s, task 6 s: without extensions SQS would redeliver it twice. Each
    # heartbeat (every 0.3 s) extends by 4 s: slack for a loaded machine.
    set_visibility_timeout(stack, 2)
    events = EventLog(stack, skipped_types=True)  # heartbeats skip the save-event rule
    with running_worker(stack, VISIBILITY_EXTENSION_AMOUNT="4") as worker:
        task = send(stack, "sample-sleep", {"seconds": 6})
        events.wait(task.request_id, "Task Processing Started")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert queue_counts(stack)[0] == 0, "the running task's message became visible"
            time.sleep(0.25)
        events.wait(task.request_id, "Task Completed", timeout=30)
        worker.stop()
    stats = worker.stats()
    assert stats is not None
    assert stats["received"] == 1 and stats["verdicts"] == {"completed": 1}
    beats = events.of(task.request_id, "Task Heartbeat")
    assert len(beats) >= 5
    assert all(b["effectiveUntil"] > b["timestampMs"] for b in beats)
    # One visibility call per heartbeat interval, not one per message per interval. (The
    # message is kept a few beats more after the task, until its delete is sent.)
    assert stats["heartbeats"] >= len(beats)
    assert stats["awsCalls"]["sqs:ChangeMessageVisibilityBatch"] <= stats["heartbeats"]


def test_worker_sigterm_drains_a_running_task_and_exits_0(stack: Stack) -> None:
    events = EventLog(stack)
    with running_worker(stack) as worker:
        task = send(stack, "sample-sleep", {"seconds": 2})
        events.wait(task.request_id, "Task Processing Started")
        worker.send(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0
    assert events.of(task.request_id, "Task Completed")
    assert queue_counts(stack) == (0, 0)


def test_worker_drain_timeout_releases_the_task_and_exits_3(stack: Stack) -> None:
    events = EventLog(stack)
    with running_worker(stack, DRAIN_TIMEOUT="500") as worker:
        task = send(stack, "sample-sleep", {"seconds": 30})
        events.wait(task.request_id, "Task Processing Started")
        worker.send(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 3
    record = state(stack, task)
    assert record is not None and record.state is TaskState.RETRYING
    # Its child started: the number stays spent, the budget does not.
    assert record.attempt == 1
    assert record.attempt_budget(3) == 4
    wait_for(lambda: queue_counts(stack)[0] == 1, timeout=10, message="message visible again")
    assert not events.of(task.request_id, "Task Failed")
    assert store(stack).get(task.tenant, task.request_id) is not None


def test_worker_second_signal_exits_at_once_and_leaves_no_child(
    stack: Stack, tmp_path: Path
) -> None:
    events = EventLog(stack)
    pid_file = tmp_path / "grandchild.pid"
    with running_worker(stack, DRAIN_TIMEOUT="60000") as worker:
        send(stack, "sample-grandchild", {"pid_file": str(pid_file), "seconds": 60})
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), message="grandchild pid")
        children = worker.task_children()
        assert children
        worker.send(signal.SIGTERM)
        worker.wait_for_output("shutdown requested")
        worker.send(signal.SIGTERM)
        code = worker.wait(timeout=20)
    assert code == 4
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not [e for e in events.poll() if e["detail-type"] == "Task Completed"]
