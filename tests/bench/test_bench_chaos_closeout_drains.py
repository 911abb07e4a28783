"""The --faults verdict's close-out and drain checks, fed records (no stack): each holds
on what the fixed code leaves and fails on what a put-back defect would."""

from __future__ import annotations

import json
from pathlib import Path

from bench.chaos_closeout import (
    BY_DLQ,
    BY_WORKER,
    CLOSEOUT_PREFIX,
    CloseoutSeen,
    closeout_rules,
    closeout_violations,
    closer_of,
)
from bench.chaos_drains import (
    GIVEN_BACK,
    RECEIVED,
    REQUEUE_FAILED,
    drain_violations,
    given_back,
    records_between,
)


def _closed(**changes: object) -> CloseoutSeen:
    seen = {"request_id": f"{CLOSEOUT_PREFIX}1", "state": "FAILED", "closed_by": BY_DLQ,
            "terminal_events": ("Task Failed",)}  # fmt: skip
    return CloseoutSeen(**{**seen, **changes})  # type: ignore[arg-type]


def test_a_close_out_with_its_one_stored_task_failed_holds() -> None:
    assert closeout_violations([_closed()]) == []
    assert closeout_violations([_closed(job_id="j", job_state="FAILED")]) == []
    # The reconciler re-sent it before the host reached its dead letter; a worker's
    # lock found no attempt left: the same single Task Failed.
    assert closeout_violations([_closed(closed_by=BY_WORKER)]) == []


def test_the_closer_is_read_where_each_writes_it() -> None:
    dlq = {"error": {"category": "server", "reason": "dlq"}, "reason": "moved to the DLQ"}
    worker = {"error": {"exception_type": "AttemptsExhausted"}, "reason": "attempts exhausted"}
    assert (closer_of(dlq), closer_of(worker)) == (BY_DLQ, BY_WORKER)
    assert closer_of({"error": {"category": "timeout"}}) is None


def test_a_close_out_whose_event_was_published_unstored_fails() -> None:
    # The publish failed, the retry found the task FAILED with nothing stored to send.
    [violation] = closeout_violations([_closed(terminal_events=())])
    assert "DLQ close-outs without exactly one stored Task Failed" in violation
    assert "stored terminal events []" in violation
    assert closeout_violations([_closed(terminal_events=("Task Failed", "Task Failed"))])


def test_a_close_out_not_done_or_its_job_left_open_fails() -> None:
    assert closeout_violations([_closed(state="PROCESSING", terminal_events=())])
    # FAILED for another reason than the DLQ's or a lock finding no attempt left.
    [violation] = closeout_violations([_closed(closed_by="timeout")])
    assert "state FAILED (closed by timeout)" in violation
    assert closeout_violations([_closed(closed_by=None)])
    [violation] = closeout_violations([_closed(job_id="j", job_state="RUNNING")])
    assert "job j left RUNNING" in violation


def test_the_close_out_fault_rule_fails_every_publish_naming_them_until_its_limit() -> None:
    [rule] = closeout_rules(2)
    assert rule["op"] == "events:PutEvents" and rule["rate"] == 1.0
    assert rule["match"] == CLOSEOUT_PREFIX and rule["limit"] == 10  # 2 x botocore's 5


def _received(message_id: str, requeued_from: str | None = None) -> dict[str, object]:
    return {"message": RECEIVED, "messageId": message_id, "requeuedFrom": requeued_from}


def test_give_backs_replaced_by_received_fresh_copies_hold() -> None:
    gave_back = {"m1": "given back", "m2": "released"}
    logs = [_received("m1"), _received("m2"), _received("c1", "m1"), _received("c2", "m2")]
    assert drain_violations(gave_back, logs) == ([], 0)


def test_a_give_back_in_place_fails() -> None:
    # The same message came back (its receive count raised): no copy names it.
    gave_back = {"m1": "given back", "m2": "released"}
    logs = [_received("m1"), _received("m2"), _received("m1"), _received("m2"),
            _received("c9", "m7")]  # fmt: skip
    violations, excused = drain_violations(gave_back, logs)
    assert excused == 0 and len(violations) == 2
    assert all("drain give-backs not requeued as a fresh copy" in v for v in violations)


def test_a_copy_that_could_not_be_sent_is_excused() -> None:
    logs = [{"message": REQUEUE_FAILED, "messageId": "m1"}]
    assert drain_violations({"m1": "released"}, logs) == ([], 1)


def test_a_drains_give_backs_are_read_from_its_own_bytes_of_the_log(tmp_path: Path) -> None:
    before = [{"message": GIVEN_BACK, "messageId": "old"}]
    during = [
        {"message": GIVEN_BACK, "messageId": "m1"},
        {"message": "message settled", "messageId": "m2", "verdict": "released"},
        {"message": "message settled", "messageId": "m3", "verdict": "completed"},
    ]
    log = tmp_path / "w0.log"
    head = "".join(json.dumps(r) + "\n" for r in before) + "not json\n"
    log.write_text(head + "".join(json.dumps(r) + "\n" for r in during))
    start, end = len(head.encode()), log.stat().st_size
    assert given_back(records_between(log, start, end)) == {"m1": "given back", "m2": "released"}
    assert records_between(tmp_path / "missing.log", 0, 10) == []


def test_drains_are_preferred_until_their_quota_but_never_take_every_strike() -> None:
    import random

    from bench.chaos_drains import Drain
    from bench.chaos_killer import Killer, Strikes
    from bench.chaos_model import Kill

    killer = Killer([], {}, Strikes(drain_share=0.1, min_drain_givebacks=2), random.Random(1))
    assert killer._drains_behind() and not killer.quota_met()  # the first strike drains
    drain = Drain.read([], at=0.0, worker="w0", worker_id="w0.1", exit_code=0)
    killer.drains.append(drain)
    assert not killer._drains_behind()  # a kill or a freeze comes next
    killer.kills.append(Kill(at=1.0, worker="w1", worker_id="w1.1", pids=(), child_only=False))
    killer.kills.append(Kill(at=2.0, worker="w1", worker_id="w1.2", pids=(), child_only=False))
    assert killer._drains_behind()
    killer.drain_givebacks = 2
    assert not killer._drains_behind() and killer.quota_met()


def test_a_drain_reads_what_it_gave_back_and_the_tasks_its_log_names() -> None:
    from bench.chaos_drains import Drain

    records: list[dict[str, object]] = [
        {"message": GIVEN_BACK, "messageId": "m1", "requestId": "r-buffered"},
        {"message": "message settled", "messageId": "m2", "verdict": "released",
         "requestId": "r-running"},
        {"message": "preparing a prefetched message failed", "requestId": "r-locking"},
        {"message": "heartbeat", "requestId": 7},
    ]  # fmt: skip
    drain = Drain.read(records, at=1.0, worker="w0", worker_id="w0.1", exit_code=0)
    assert drain.gave_back == {"m1": "given back", "m2": "released"}
    assert drain.request_ids == {"r-buffered", "r-running", "r-locking"}
