"""The resume benchmark at a tiny size: its report's shape and invariants, not its speed.

One four-turn task in each arm (real workers, the bundled CLI, the offline model
server, a SIGKILL at the turn the seed picks), and the S3 relay it counts with, on its
own: what it records is what boto3 sent and got.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentq.local.aws import MotoServer, local_session_clients
from bench import report, resume
from bench.resume_report import summarize, tokens
from bench.s3_counter import S3Counter
from bench.stack import new_stage

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_the_relay_counts_each_s3_request_and_its_bytes_exactly(moto_server: MotoServer) -> None:
    stage = new_stage(moto_server, prefix="t")
    bucket = stage.resources.bucket
    with S3Counter(moto_server.url) as counter:
        s3 = local_session_clients(counter.url)["s3"]
        body = b"x" * 70_001
        s3.put_object(Bucket=bucket, Key="task/a/checkpoint/session.jsonl", Body=body)
        got = s3.get_object(Bucket=bucket, Key="task/a/checkpoint/session.jsonl")["Body"].read()
        with pytest.raises(s3.exceptions.ClientError):
            s3.get_object(Bucket=bucket, Key="task/b/checkpoint/session.jsonl")
        s3.put_object(Bucket=bucket, Key="task/a/result.json", Body=b"{}")
    assert got == body
    # What went through the relay landed in moto unchanged.
    stored = stage.clients["s3"].get_object(Bucket=bucket, Key="task/a/checkpoint/session.jsonl")
    assert stored["Body"].read() == body
    checkpoints = counter.requests(key_suffix="checkpoint/session.jsonl")
    assert [(r.method, r.status) for r in checkpoints] == [
        ("PUT", 200),
        ("GET", 200),
        ("GET", 404),  # a missing key (403 where the caller may not list the bucket)
    ]
    assert checkpoints[0].sent_bytes == 70_001 and checkpoints[1].received_bytes == 70_001
    assert len(counter.requests(method="PUT")) == 2


def test_a_tiny_run_reports_every_arm_and_holds_its_invariants(moto_server: MotoServer) -> None:
    config = resume.Config(tasks=1, turns=4, seed=7, timeout_s=180)
    (k,) = config.kill_turns()
    assert 2 <= k <= 3
    result = resume.run(config, server=moto_server)

    assert result["violations"] == []
    (task,) = result["tasks"]
    assert task["kill_turn"] == k
    clean = result["runs"]["clean"]["tasks"][0]
    assert [r["outcome"] for r in clean["requests"]] == ["tool_use:Bash"] * 3 + [
        "tool_use:StructuredOutput"
    ]
    assert task["clean_tokens"] == tokens(clean["requests"]) > 0
    # Resumed at turn k, from attempt 1's checkpoint; the restart began again at turn 0
    # and its retry cost what the clean run did, so restart's extra is attempt 1's k turns.
    assert task["resume"]["resume"] == {"status": "resumed", "from_attempt": 1, "turns": k}
    assert task["resume"]["retry_first_turn"] == k
    assert task["restart"]["retry_first_turn"] == 0
    assert task["restart"]["retry_tokens"] == task["clean_tokens"]
    restart_requests = result["runs"]["restart"]["tasks"][0]["requests"]
    assert task["restart"]["extra_tokens"] == tokens(restart_requests[:k])
    assert 0 < task["resume"]["extra_tokens"] < task["restart"]["extra_tokens"]
    assert result["resume_extra_pct_of_restart"] == pytest.approx(
        100 * task["resume"]["extra_tokens"] / task["restart"]["extra_tokens"], abs=0.1
    )
    for arm in ("resume", "restart"):
        assert task[arm]["wall_after_kill_s"] > task[arm]["kill_to_retry_s"] > 0

    # The checkpoint's cost, counted: a part per turn at the bench's interval (a turn may
    # share one), and the whole checkpoint at the end (the session's final answer is in it
    # only); the parts hold only what each turn added, so together they are about one
    # whole checkpoint (each put of the whole would make them about turns / 2 of it). A resume
    # probes its own attempt (nothing), then reads attempt 1's parts: a HEAD for the
    # snapshot, a GET each, misses at the ends. The restart arm (resume: false) touches none.
    checkpoint = result["checkpoint"]
    # At most a part per turn, one for the final answer the child writes after its last
    # turn (a loaded host may see them apart), and the whole.
    assert 0 < checkpoint["puts_per_turn"] <= (config.turns + 2) / config.turns
    assert 0 < checkpoint["largest_part_bytes"] < checkpoint["whole_bytes_per_task"]
    parts_bytes = checkpoint["part_bytes_per_turn"] * config.turns
    assert 0.5 < parts_bytes / checkpoint["whole_bytes_per_task"] < 1.5
    assert checkpoint["reads_found_per_resume"] >= 2
    assert checkpoint["reads_per_resume"] == checkpoint["reads_found_per_resume"] + 5
    assert checkpoint["bytes_per_resume"] > 0
    assert checkpoint["restart_arm_requests"] == 0

    assert not isinstance(report.table("resume", result), str)
    assert report.verdicts({"resume": result}).row_count == 1


def _requests(turns: list[int], at: float, usage: int = 100) -> list[dict[str, Any]]:
    return [{"turn": t, "outcome": "tool_use:Bash", "usage": {"input_tokens": usage + t},
             "received_at": at + n} for n, t in enumerate(turns)]  # fmt: skip


def _raw(resume_retry_turns: list[int], resume_status: dict[str, Any] | None) -> dict[str, Any]:
    """One four-turn task killed at turn 2, as the arms would record it."""
    stall = [{"turn": 2, "outcome": "stall", "usage": None, "received_at": 2.5}]
    done = {"end": "Task Completed", "sent": 0.0, "ended": 20.0}
    s3: dict[str, Any] = {"requests": 0, "checkpoint_requests": []}
    put = {"method": "PUT", "key": "task/bench/c/attempt-1/checkpoint/session.jsonl",
           "status": 200, "sent_bytes": 10, "received_bytes": 0, "at": 1.0}  # fmt: skip
    return {
        "clean": {"tasks": [{**done, "request_id": "c", "attempt": 1, "resume": None,
                             "killed": None, "requests": _requests([0, 1, 2, 3], 0.0)}],
                  "s3": {**s3, "checkpoint_requests": [put]}},
        "resume": {"tasks": [{**done, "request_id": "r", "attempt": 2, "resume": resume_status,
                              "killed": 3.0,
                              "requests": _requests([0, 1], 0.0) + stall
                              + _requests(resume_retry_turns, 10.0, usage=110)}],
                   "s3": s3},
        "restart": {"tasks": [{**done, "request_id": "s", "attempt": 2, "resume": None,
                               "killed": 3.0,
                               "requests": _requests([0, 1], 0.0) + stall
                               + _requests([0, 1, 2, 3], 10.0)}],
                    "s3": s3},
    }  # fmt: skip


def test_a_retry_that_did_not_resume_at_its_turn_is_a_violation() -> None:
    resumed = {"status": "resumed", "from_attempt": 1, "turns": 2}
    good = summarize(_raw([2, 3], resumed), turns=4, kill_turns=[2])
    assert good["tasks"][0]["restart"]["extra_tokens"] == 100 + 101
    assert good["tasks"][0]["resume"]["extra_tokens"] == (112 + 113) - (102 + 103)
    assert good["violations"] == []

    started_over = summarize(_raw([0, 1, 2, 3], {"status": "fresh", "reason": "x"}),
                             turns=4, kill_turns=[2])  # fmt: skip
    assert any("did not resume at its turn" in v for v in started_over["violations"])
