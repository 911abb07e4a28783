"""The dispatcher Lambda drives job DAGs: order, results, exactly-once enqueue, policies.

Workers are played by the test (lock, S3 result, finalize — as the worker does) and
the dispatcher is called with real EventBridge envelopes against moto's server.
Messages are counted by draining the task queue.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from conftest import Stack
from jobs_support import (
    bus_events,
    client_for,
    drain,
    eventbridge,
    finish,
    keys_sent,
    of_type,
    start,
)

from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.jobs import result_key, task_request_id
from agentq.states import TaskState
from agentq.store import TaskStore, keys
from lambdas import dispatcher

pytestmark = pytest.mark.timeout(120)

DIAMOND: dict[str, Any] = {
    "tasks": {
        "A": {"definition": "noop", "input": {"n": 1}},
        "B": {"definition": "summarize", "input": {"from_a": "${tasks.A.result}"}},
        "C": {"definition": "summarize", "depends_on": ["A"]},
        "D": {
            "definition": "write-report",
            "input": {
                "b": "${tasks.B.result}",
                "c_text": "${tasks.C.result.text}",
                "note": "C said: ${tasks.C.result.text}",
            },
        },
    }
}


def deliver(event: Any) -> dict[str, Any]:
    answer: dict[str, Any] = dispatcher.handler(eventbridge(event), None)
    return answer


def state_of(stack: Stack, job_id: str, key: str) -> TaskState:
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    return store.require("default", task_request_id(job_id, key)).state


def test_jobs_diamond_completes_in_order_with_upstream_results(stack: Stack) -> None:
    client = client_for(stack)
    job = client.create_job(DIAMOND, job_id="diamond")
    assert job.total == 4 and job.state == "RUNNING"
    roots = drain(stack)
    assert [m["taskKey"] for m in roots] == ["A"]
    assert roots[0]["_attributes"]["requestId"] == "diamond-A"
    assert roots[0]["_attributes"]["jobId"] == "diamond"
    assert {k: state_of(stack, "diamond", k) for k in "BCD"} == dict.fromkeys(
        "BCD", TaskState.BLOCKED
    )

    deliver(finish(stack, "diamond", "A", result={"value": 41}))
    sent = drain(stack)
    assert sorted(m["taskKey"] for m in sent) == ["B", "C"]
    assert next(m for m in sent if m["taskKey"] == "B")["input"] == {"from_a": {"value": 41}}

    deliver(finish(stack, "diamond", "C", result={"text": "from C"}))
    assert keys_sent(stack) == []  # D still waits for B
    assert state_of(stack, "diamond", "D") is TaskState.BLOCKED

    deliver(finish(stack, "diamond", "B", result={"summary": [1, 2]}, cost_usd=0.5))
    [d] = drain(stack)
    assert d["taskKey"] == "D"
    assert d["input"] == {"b": {"summary": [1, 2]}, "c_text": "from C", "note": "C said: from C"}
    assert client.get_job("diamond").state == "RUNNING"

    outcome = deliver(finish(stack, "diamond", "D", result={"report": "done"}))
    assert outcome["closed"] == "COMPLETED"
    final = client.get_job("diamond")
    assert (final.state, final.counts["completed"], final.done) == ("COMPLETED", 4, 4)
    assert final.cost_usd == pytest.approx(0.5)
    closes = of_type(bus_events(stack), "Job Completed")
    assert len(closes) == 1 and closes[0]["detail"]["jobId"] == "diamond"


def test_jobs_fan_out_of_twenty_then_fan_in(stack: Stack) -> None:
    client = client_for(stack)
    spec = {
        "tasks": {
            "summarize": {
                "definition": "summarize",
                "for_each": [f"document {i}" for i in range(20)],
                "input": {"document": "${item}", "position": "${index}"},
            },
            "report": {
                "definition": "write-report",
                "input": {"summaries": "${groups.summarize.results}"},
            },
        }
    }
    client.create_job(spec, job_id="fan")
    roots = drain(stack)
    assert len(roots) == 20
    assert {m["input"]["document"] for m in roots} == {f"document {i}" for i in range(20)}
    for i in reversed(range(1, 20)):  # completion order differs from declaration order
        deliver(finish(stack, "fan", f"summarize_{i}", result={"summary": i}))
    assert keys_sent(stack) == []  # 19 of 20 done: the fan-in still waits
    deliver(finish(stack, "fan", "summarize_0", result={"summary": 0}))
    [report] = drain(stack)
    assert report["taskKey"] == "report"
    assert report["input"]["summaries"] == [{"summary": i} for i in range(20)]
    deliver(finish(stack, "fan", "report"))
    assert client.get_job("fan").state == "COMPLETED"


def test_jobs_duplicate_and_reordered_events_enqueue_nothing_twice(stack: Stack) -> None:
    client = client_for(stack)
    client.create_job(DIAMOND, job_id="dup")
    drain(stack)
    a_done = finish(stack, "dup", "A")
    for _ in range(3):  # EventBridge delivers at least once
        deliver(a_done)
    assert keys_sent(stack) == ["B", "C"]

    c_done = finish(stack, "dup", "C", result={"text": "c"})
    b_done = finish(stack, "dup", "B")
    # Both finished before either event arrives; then every event twice, out of order.
    for event in (c_done, b_done, c_done, a_done, b_done):
        deliver(event)
    assert keys_sent(stack) == ["D"]

    d_done = finish(stack, "dup", "D")
    outcomes = [deliver(e) for e in (d_done, d_done, b_done)]
    assert [o["closed"] for o in outcomes] == ["COMPLETED", None, None]
    job = client.get_job("dup")
    assert (job.counts["completed"], job.done) == (4, 4)
    assert len(of_type(bus_events(stack), "Job Completed")) == 1


def test_jobs_dispatch_interrupted_after_transition_is_finished_by_the_retry(
    stack: Stack,
) -> None:
    client = client_for(stack)
    client.create_job(
        {"tasks": {"A": {"definition": "noop"}, "B": {"definition": "noop", "depends_on": "A"}}},
        job_id="crash",
    )
    drain(stack)
    a_done = finish(stack, "crash", "A")
    # The invocation moved B to PENDING and died before SendMessage.
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    b = store.require("default", "crash-B")
    assert b.envelope is not None
    store.transition("default", "crash-B", from_states=[TaskState.BLOCKED],
                     to_state=TaskState.PENDING,
                     fields={"envelope": dict(b.envelope), "enqueuedBy": a_done.event_id})  # fmt: skip
    deliver(a_done)  # Lambda's retry of the same event
    assert keys_sent(stack) == ["B"]
    deliver(a_done)
    assert keys_sent(stack) == []


def test_jobs_fail_fast_cancels_everything_not_started(stack: Stack) -> None:
    client = client_for(stack)
    spec = {**DIAMOND, "tasks": {**DIAMOND["tasks"],
            "E": {"definition": "noop"}, "F": {"definition": "noop", "depends_on": ["E"]}}}  # fmt: skip
    client.create_job(spec, job_id="ff")
    assert keys_sent(stack) == ["A", "E"]
    start(stack, "ff", "E")  # E is running when the failure happens
    deliver(finish(stack, "ff", "A"))
    assert keys_sent(stack) == ["B", "C"]
    start(stack, "ff", "C")

    outcome = deliver(finish(stack, "ff", "B", TaskState.FAILED))
    assert sorted(outcome["cancelled"]) == ["D", "F"]
    assert outcome["closed"] is None  # C and E still run
    assert keys_sent(stack) == []
    assert state_of(stack, "ff", "C") is TaskState.PROCESSING

    deliver(finish(stack, "ff", "E"))
    assert keys_sent(stack) == []  # F was cancelled, never enqueued
    outcome = deliver(finish(stack, "ff", "C", TaskState.TIMEOUT))
    assert outcome["closed"] == "FAILED"
    job = client.get_job("ff")
    assert (job.counts["completed"], job.counts["failed"], job.counts["timedOut"],
            job.counts["cancelled"], job.done) == (2, 1, 1, 2, 6)  # fmt: skip
    events = bus_events(stack)
    assert len(of_type(events, "Job Failed")) == 1
    assert {e["detail"]["requestId"] for e in of_type(events, "Task Cancelled")} == {
        "ff-D",
        "ff-F",
    }


def test_jobs_fail_fast_cancels_a_queued_task_before_a_worker_takes_it(stack: Stack) -> None:
    client = client_for(stack)
    spec = {"tasks": {"A": {"definition": "noop"}, "B": {"definition": "noop"}}}
    client.create_job(spec, job_id="ffq")
    drain(stack)
    outcome = deliver(finish(stack, "ffq", "A", TaskState.FAILED))
    assert outcome["cancelled"] == ["B"]
    assert outcome["closed"] == "FAILED"
    assert state_of(stack, "ffq", "B") is TaskState.CANCELLED


def test_jobs_continue_runs_what_does_not_depend_on_the_failure(stack: Stack) -> None:
    client = client_for(stack)
    spec = {
        "failure_policy": "continue",
        "tasks": {
            **DIAMOND["tasks"],
            "E": {"definition": "noop"},
            "F": {"definition": "noop", "depends_on": ["E"]},
            "G": {"definition": "noop", "depends_on": ["D"]},
        },
    }
    client.create_job(spec, job_id="cont")
    assert keys_sent(stack) == ["A", "E"]
    deliver(finish(stack, "cont", "A"))
    assert keys_sent(stack) == ["B", "C"]

    outcome = deliver(finish(stack, "cont", "B", TaskState.FAILED))
    assert sorted(outcome["cancelled"]) == ["D", "G"]  # transitive dependents only
    deliver(finish(stack, "cont", "C", result={"text": "c"}))
    assert keys_sent(stack) == []
    deliver(finish(stack, "cont", "E"))
    assert keys_sent(stack) == ["F"]
    outcome = deliver(finish(stack, "cont", "F"))
    assert outcome["closed"] == "FAILED"
    job = client.get_job("cont")
    assert (job.counts["completed"], job.counts["failed"], job.counts["cancelled"]) == (4, 1, 2)


def test_jobs_missing_upstream_result_fails_the_dependent(stack: Stack) -> None:
    client = client_for(stack)
    spec = {
        "failure_policy": "continue",
        "tasks": {
            "A": {"definition": "noop"},
            "B": {"definition": "noop", "input": {"a": "${tasks.A.result.absent}"}},
        },
    }
    client.create_job(spec, job_id="miss")
    drain(stack)
    outcome = deliver(finish(stack, "miss", "A", result={"present": 1}))
    assert outcome["failed"] == ["B"] and outcome["closed"] == "FAILED"
    record = TaskStore(stack.dynamodb, stack.resources.table_name).require("default", "miss-B")
    assert record.raw["error"]["category"] == "validation"
    assert "absent" in record.raw["error"]["message"]
    assert keys_sent(stack) == []


def test_jobs_dispatcher_ignores_events_it_cannot_use(stack: Stack) -> None:
    assert dispatcher.handler({"detail-type": "Task Completed", "detail": {}}, None)["status"] == (
        "invalid"
    )
    from agentq.events import task_event

    lone = task_event("Task Completed", request_id="lone", tenant="default")
    assert deliver(lone)["status"] == "ignored"
    orphan = task_event("Task Completed", request_id="x-A", tenant="default", job_id="nojob")
    assert deliver(orphan)["status"] == "missing"
    assert keys.job_pk("default", "nojob")  # nothing was created for it
    assert drain(stack) == []


def test_jobs_dispatcher_logs_and_counts_through_powertools(
    stack: Stack,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")  # the local stack mutes them
    with caplog.at_level(logging.ERROR, logger="agentq-dispatcher"):
        dispatcher.handler({"detail-type": "Task Completed", "detail": {}}, None)
    # The Powertools logger of the function's service, with the error as a key.
    [record] = [r for r in caplog.records if r.name == "agentq-dispatcher"]
    assert record.getMessage() == "dropping malformed dispatcher event"
    assert "tenant" in record.__dict__["error"]
    # And its metric, as CloudWatch embedded metric format on stdout.
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    [emf] = [line for line in lines if "_aws" in line]
    assert emf["EventsInvalid"] in (1.0, [1.0])
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "agentq"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested"),  # json.loads would raise RecursionError
        (b'{"x": NaN}', "NaN"),
        (b'{"x": "' + b"y" * (1024 * 1024) + b'"}', "a job reference reads at most"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)  # fmt: skip
def test_jobs_a_result_the_dispatcher_cannot_use_fails_the_dependent(
    stack: Stack, body: bytes, words: str
) -> None:
    client = client_for(stack)
    spec = {
        "failure_policy": "continue",
        "tasks": {
            "A": {"definition": "noop"},
            "B": {"definition": "noop", "input": {"a": "${tasks.A.result}"}},
            "C": {"definition": "noop", "depends_on": ["A"]},
        },
    }
    client.create_job(spec, job_id="poison")
    drain(stack)
    event = finish(stack, "poison", "A")
    # What the task code wrote replaces the result the helper stored.
    stack.s3.put_object(Bucket=stack.resources.bucket, Key=result_key("default", "poison-A", 1),
                        Body=body)  # fmt: skip
    outcome = deliver(event)
    assert outcome["failed"] == ["B"] and outcome["enqueued"] == ["C"]
    record = TaskStore(stack.dynamodb, stack.resources.table_name).require("default", "poison-B")
    assert record.state is TaskState.FAILED
    assert words in record.raw["error"]["message"], record.raw["error"]
    assert keys_sent(stack) == ["C"]


def test_jobs_a_continuation_is_sent_once_its_source_completed_naming_it(stack: Stack) -> None:
    client = client_for(stack)
    notes = {"prompt": "Note {text}", "output_schema": {"type": "object"}, "resume": True}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=notes)
    )
    spec = {"tasks": {
        "draft": {"definition": "notes", "input": {"text": "x"}},
        "revise": {"definition": "notes", "continues": "draft", "prompt": "Shorter."},
    }}  # fmt: skip
    client.create_job(spec, job_id="cont")
    assert [m["taskKey"] for m in drain(stack)] == ["draft"]
    deliver(finish(stack, "cont", "draft", result={"title": "t"}))
    [revise] = drain(stack)
    assert revise["taskKey"] == "revise"
    assert revise["continues"] == task_request_id("cont", "draft")
    assert revise["prompt"] == "Shorter."


def test_jobs_a_tasks_own_resume_reaches_the_envelope_it_is_sent_in(stack: Stack) -> None:
    client = client_for(stack)
    notes = {"prompt": "Note {text}", "output_schema": {"type": "object"}}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=notes)
    )
    spec = {"tasks": {
        "draft": {"definition": "notes", "input": {"text": "x"}, "resume": True},
        "check": {"definition": "notes", "input": {"text": "${tasks.draft.result.title}"},
                  "resume": False},
        "plain": {"definition": "notes", "input": {"text": "y"}, "depends_on": "draft"},
    }}  # fmt: skip
    client.create_job(spec, job_id="own")
    [draft] = drain(stack)  # a root: sent at creation
    assert draft["taskKey"] == "draft" and draft["resume"] is True
    deliver(finish(stack, "own", "draft", result={"title": "t"}))
    sent = {m["taskKey"]: m for m in drain(stack)}  # sent by the dispatcher
    assert sent["check"]["resume"] is False and sent["check"]["input"] == {"text": "t"}
    assert "resume" not in sent["plain"]
