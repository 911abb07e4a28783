"""Per-tenant concurrency limits across a fleet of real workers on moto.

Two workers of four slots each share the limit through the tenant's seats: the sample
tasks write their own start and end times (side log), so "never more than the limit at
once" is read from what really ran, not from what the workers believe.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import running_worker, set_visibility_timeout, store

from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(240)

SLOTS = {"MAX_CONCURRENT_CLAUDE": "4", "TENANT_LIMIT_BACKOFF": "400"}
# Leases of 12 s renewed every second: on a loaded machine a 3 s lease may be fenced
# (stopped, run again as a new attempt), which would blur "no attempt spent".
PATIENT = {"VISIBILITY_EXTENSION_AMOUNT": "8", "VISIBILITY_EXTENSION_INTERVAL": "1000"}


def _send(stack: Stack, tenant: str, seconds: float, side_log: Path) -> TaskEnvelope:
    envelope = TaskEnvelope(
        request_id=f"{tenant}-{uuid.uuid4().hex[:10]}",
        tenant=tenant,
        definition="sample-sleep",
        input={"seconds": seconds, "side_log": str(side_log)},
    )
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, **envelope.send_fields())
    return envelope


def _runs(side_log: Path, tasks: list[TaskEnvelope]) -> list[dict[str, Any]]:
    ids = {t.request_id for t in tasks}
    if not side_log.exists():
        return []
    lines = [json.loads(line) for line in side_log.read_text().splitlines()]
    return [run for run in lines if run["requestId"] in ids]


def _most_at_once(runs: list[dict[str, Any]]) -> int:
    # An end sorts before a start at the same instant: touching runs do not overlap.
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _all_completed(stack: Stack, tasks: list[TaskEnvelope]) -> bool:
    records = [store(stack).get(t.tenant, t.request_id) for t in tasks]
    return all(r is not None and r.state is TaskState.COMPLETED for r in records)


def _live_seats(stack: Stack, tenant: str) -> list[Any]:
    return [s for s in store(stack).tenant_limits().seats(tenant) if s.live(now_ms())]


def test_a_tenant_over_its_limit_waits_and_other_tenants_run_meanwhile(
    stack: Stack, tmp_path: Path
) -> None:
    side_log = tmp_path / "runs.jsonl"
    # The fleet's default is 2; `calm` has an override of its own.
    store(stack).tenant_limits().set("calm", 4)
    env = {**SLOTS, **PATIENT, "TENANT_CONCURRENCY_LIMIT": "2"}
    with running_worker(stack, "a", **env) as first, running_worker(stack, "b", **env) as second:
        crowd = [_send(stack, "crowd", 2.0, side_log) for _ in range(6)]
        calm = [_send(stack, "calm", 1.0, side_log) for _ in range(4)]
        wait_for(lambda: _all_completed(stack, crowd + calm), timeout=150,
                 message="every task of both tenants completed")  # fmt: skip
        first.stop()
        second.stop()
    crowd_runs, calm_runs = _runs(side_log, crowd), _runs(side_log, calm)
    assert len(crowd_runs) == 6 and len(calm_runs) == 4, "each task ran once"
    assert _most_at_once(crowd_runs) == 2, "the limit was reached and never exceeded"
    # Not held back: every calm task started before the crowd's last one could.
    last_crowd_start = max(r["start"] for r in crowd_runs)
    assert max(r["start"] for r in calm_runs) < last_crowd_start
    # The back-offs spent no attempt and no receive that counts toward the DLQ.
    for task in crowd + calm:
        record = store(stack).require(task.tenant, task.request_id)
        assert record.attempt == 1, (task.request_id, record.attempt)
    dlq = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert dlq["ApproximateNumberOfMessages"] == "0"
    verdicts: dict[str, int] = {}
    for worker in (first, second):
        stats = worker.stats()
        assert stats is not None
        for verdict, count in stats["verdicts"].items():
            verdicts[verdict] = verdicts.get(verdict, 0) + count
    assert verdicts.get("completed") == 10, verdicts
    assert _live_seats(stack, "crowd") == [] and _live_seats(stack, "calm") == []
    # Four of the crowd's six had to wait, each parked or refused (sent back) at least once.
    parked = sum(
        w.output().count("tenant at its concurrency limit; parked") for w in (first, second)
    )
    assert parked + verdicts.get("tenant_limit", 0) >= 4, (parked, verdicts)


def test_a_killed_workers_seats_come_free_within_a_lease(stack: Stack, tmp_path: Path) -> None:
    side_log = tmp_path / "runs.jsonl"
    set_visibility_timeout(stack, 3)  # the killed worker's messages come back soon
    store(stack).tenant_limits().set("crowd", 2)  # an override; the fleet has no default
    events = EventLog(stack)
    steady = {**SLOTS, "VISIBILITY_EXTENSION_AMOUNT": "4", "VISIBILITY_EXTENSION_INTERVAL": "500"}
    with running_worker(stack, "doomed", **steady) as doomed:
        held = [_send(stack, "crowd", 6.0, side_log) for _ in range(2)]
        for task in held:
            events.wait(task.request_id, "Task Processing Started", timeout=60)
        doomed.kill()
    seats = store(stack).tenant_limits().seats("crowd")
    assert {s.worker_id for s in seats if s.holder} == {f"doomed-{os.getpid()}"}
    late = _send(stack, "crowd", 0.5, side_log)
    with running_worker(stack, "heir", **steady) as heir:
        wait_for(lambda: _all_completed(stack, [*held, late]), timeout=120,
                 message="the killed worker's tasks and a new one completed")  # fmt: skip
        heir.stop()
    # Both seats were the dead worker's; the heir could only run by taking them over.
    assert all(store(stack).require("crowd", t.request_id).attempt >= 2 for t in held)
    runs = _runs(side_log, [*held, late])
    assert _most_at_once(runs) <= 2
    assert _live_seats(stack, "crowd") == []


def test_a_limited_tenants_refusals_never_hold_a_slot(stack: Stack, tmp_path: Path) -> None:
    """Two slots, one held by the crowd's only seat: the crowd's other tasks are locked
    before they take a slot, so each refusal is settled without one and the free slot
    stays open to the calm tenant's work."""
    side_log = tmp_path / "runs.jsonl"
    store(stack).tenant_limits().set("crowd", 1)  # an override; the fleet has no default
    events = EventLog(stack)
    env = {**PATIENT, "MAX_CONCURRENT_CLAUDE": "2", "TENANT_LIMIT_BACKOFF": "400"}
    with running_worker(stack, "gate", **env) as worker:
        seated = _send(stack, "crowd", 6.0, side_log)
        events.wait(seated.request_id, "Task Processing Started", timeout=60)
        waiting = [_send(stack, "crowd", 0.3, side_log) for _ in range(3)]
        wait_for(lambda: worker.output().count("tenant at its concurrency limit") >= 3,
                 timeout=60, message="the crowd's waiting tasks were refused")  # fmt: skip
        calm = [_send(stack, "calm", 0.5, side_log) for _ in range(2)]
        wait_for(lambda: _all_completed(stack, [seated, *waiting, *calm]), timeout=120,
                 message="every task completed")  # fmt: skip
        worker.stop()
    records = worker.log_records()
    settled = [r for r in records if r.get("message") == "message settled"]
    refused = [r for r in settled if r.get("verdict") == "tenant_limit"]
    # Refused by a lock, or sent straight back while the crowd's share was parked.
    sent_back = [
        r
        for r in records
        if r.get("message") == "tenant at its concurrency limit; sent back (parked full here)"
    ]
    assert len(refused) + len(sent_back) >= 3, settled
    assert [r for r in refused if r.get("slot") is not False] == [], "a refusal held a slot"
    assert all(r.get("slot") is True for r in settled if r.get("verdict") == "completed")
    runs = {r["requestId"]: r for r in _runs(side_log, [seated, *waiting, *calm])}
    # The calm tenant ran beside the crowd's seated task, not after it.
    seated_end = runs[seated.request_id]["end"]
    assert all(runs[t.request_id]["start"] < seated_end for t in calm), runs
    assert _most_at_once(_runs(side_log, [seated, *waiting])) == 1
    for task in [seated, *waiting]:
        assert store(stack).require("crowd", task.request_id).attempt == 1


def test_a_parked_task_takes_the_seat_its_tenant_frees_on_this_worker(
    stack: Stack, tmp_path: Path
) -> None:
    """With a back-off of a minute or more, the waiting task can only have started
    within 50 s by being parked here and woken when the seated task ended."""
    side_log = tmp_path / "runs.jsonl"
    store(stack).tenant_limits().set("crowd", 1)
    events = EventLog(stack)
    env = {**PATIENT, "MAX_CONCURRENT_CLAUDE": "2", "TENANT_LIMIT_BACKOFF": "120000",
           "TENANT_LIMIT_PARK": "100000"}  # fmt: skip
    with running_worker(stack, "park", **env) as worker:
        seated = _send(stack, "crowd", 2.0, side_log)
        events.wait(seated.request_id, "Task Processing Started", timeout=60)
        waiting = _send(stack, "crowd", 0.3, side_log)
        wait_for(lambda: "tenant at its concurrency limit; parked" in worker.output(),
                 timeout=30, message="the waiting task parked")  # fmt: skip
        wait_for(lambda: _all_completed(stack, [seated, waiting]), timeout=50,
                 message="the parked task ran when the seat freed")  # fmt: skip
        worker.stop()
    settled = [r for r in worker.log_records() if r.get("message") == "message settled"]
    assert [r["verdict"] for r in settled] == ["completed", "completed"], settled
    assert any(r.get("message") == "parked task took a seat" for r in worker.log_records())
    runs = _runs(side_log, [seated, waiting])
    assert _most_at_once(runs) == 1
    assert store(stack).require("crowd", waiting.request_id).attempt == 1
