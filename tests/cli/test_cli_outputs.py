"""What a task left behind and how it reads: `agentq result/logs/trace`, the events
timeline, costs and cancel reasons, through the real CLI against a real worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import REPO, agentq, fresh_shell, one_line_error
from conftest import Stack
from support import wait_for

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import WorkerProcess, fast_env
from agentq.states import TaskState
from agentq.store import TaskStore

pytestmark = pytest.mark.timeout(300)

ESCAPE = "\x1b]0;owned\x07\x1b[2J"  # retitles the terminal and clears it, if printed raw


@pytest.fixture
def running(stack: Stack) -> Iterator[dict[str, str]]:
    """A worker and the Lambda host (events stored, jobs dispatched); yields a user's shell."""
    env = {**stack.env(), **fast_env()}
    with (
        LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                   serve_dlq=False),
        WorkerProcess("cli-outputs").start(env) as worker,
    ):  # fmt: skip
        try:
            yield fresh_shell(
                **stack.env(), TASK_DEFINITIONS_DIR=fast_env()["TASK_DEFINITIONS_DIR"]
            )
        except BaseException:
            print(worker.output()[-4000:])
            raise


def _completed(shell: dict[str, str], definition: str, task_input: object) -> str:
    ran = agentq(shell, "submit", definition, "--input", json.dumps(task_input),
                 "--wait", "--timeout", "90", "--json")  # fmt: skip
    assert ran.code == 0, ran
    return str(ran.json()["requestId"])


def test_result_logs_and_trace_of_a_task(running: dict[str, str]) -> None:
    files = {
        "logs/run.log": f"step one{ESCAPE}\nstep two\n",
        "logs/quiet.log": "",
        "traces/session_trace.json": json.dumps({"turns": 2, "tools": [{"name": "Read"}]}),
    }
    request_id = _completed(running, "sample-artifacts", {"files": files})

    assert agentq(running, "result", request_id, "--json").json() == {
        "files": sorted(files),
        "echo": None,
    }
    logs = agentq(running, "logs", request_id, "--json").json()
    assert logs["logs/run.log"] == files["logs/run.log"]
    shown = agentq(running, "logs", request_id)
    assert shown.code == 0 and "step one" in shown.stdout and "step two" in shown.stdout
    assert "quiet.log" in shown.stdout and "(empty)" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    trace = agentq(running, "trace", request_id, "--json")
    assert trace.json() == {"turns": 2, "tools": [{"name": "Read"}]}
    assert '"tools"' in agentq(running, "trace", request_id).stdout  # not a worker's: JSON
    worker_trace = {"usage": {"input_tokens": 10}, "num_turns": 1, "turns": [],
                    "tool_calls": [{"name": "Read", "status": "ok", "input_bytes": 3}]}  # fmt: skip
    agent = _completed(running, "sample-artifacts",
                       {"files": {"traces/session_trace.json": json.dumps(worker_trace)}})  # fmt: skip
    drawn = agentq(running, "trace", agent).stdout
    assert "agent trace: 0 model response(s), 1 turn(s)" in drawn, drawn
    assert "tool calls" in drawn and "Read" in drawn

    plain = _completed(running, "sample-echo", {"hello": "x"})
    missing = agentq(running, "trace", plain, "--json")
    assert missing.code == 3 and "agent trace" in one_line_error(missing)
    assert missing.json()["error"]["kind"] == "not_found"


def test_events_and_status_read_as_sentences_not_json(running: dict[str, str]) -> None:
    message = "the customer id is missing " + "and this sentence is long " * 4 + "END"
    ran = agentq(running, "submit", "sample-fail", "--input",
                 json.dumps({"category": "validation", "message": message}),
                 "--wait", "--timeout", "90", "--json")  # fmt: skip
    assert ran.code == 4, ran
    request_id = ran.json()["requestId"]
    events = wait_for(
        lambda: (e := agentq(running, "events", request_id)) and "Task Failed" in e.stdout and e,
        timeout=60, message="the stored Task Failed event",
    )  # fmt: skip
    assert "validation: the customer id is missing" in events.stdout
    assert "END" in events.stdout  # the whole message, not cut mid-error
    assert '{"' not in events.stdout  # no raw JSON in the detail column
    status = agentq(running, "status", request_id)
    assert status.code == 4 and "validation: the customer id" in status.stdout
    assert "$0.0000" in status.stdout
    # A task of a few milliseconds reads as such, not as `0.0s`.
    took = agentq(running, "status", request_id, "--json").json()["durationMs"]
    assert took < 1000 and f"{took}ms" in status.stdout, status.stdout


def test_a_job_task_cancelled_by_a_failure_says_why(
    running: dict[str, str], tmp_path: Path
) -> None:
    spec = {"tasks": {"first": {"definition": "sample-fail", "input": {"category": "validation"}},
                      "second": {"definition": "sample-echo", "depends_on": ["first"]}}}  # fmt: skip
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    created = agentq(running, "job", "create", str(spec_file), "--job-id", "doomed", "--wait",
                     "--timeout", "90")  # fmt: skip
    assert created.code == 4, created
    status = agentq(running, "job", "status", "doomed")
    assert status.code == 4
    assert "fail_fast: task first failed" in status.stdout, status


def test_a_prompt_placeholder_missing_from_the_input_is_refused_at_submit(stack: Stack) -> None:
    shell = fresh_shell(**stack.env(), TASK_DEFINITIONS_DIR=str(REPO / "definitions" / "samples"))
    ran = agentq(shell, "submit", "summarize", "--input", '{"text": "a document"}', "--json")
    assert ran.code == 6, ran
    line = one_line_error(ran)
    assert "input.document: is required by the prompt of 'summarize'" in line
    assert "add it to --input" in line  # and how to see what the prompt wants
    assert agentq(shell, "submit", "summarize", "--input", '{"document": "a"}').code == 0


def test_a_float_cost_prints_as_dollars(stack: Stack) -> None:
    # A cost summed from token prices is rarely a round float (the issue saw
    # 0.010705000000000001 printed raw); the worker's lock and finalize record it.
    shell = fresh_shell(**stack.env(), TASK_DEFINITIONS_DIR=fast_env()["TASK_DEFINITIONS_DIR"])
    request_id = agentq(shell, "submit", "sample-echo", "--input", "{}").stdout.strip()
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    record = tasks.require("default", request_id)
    assert record.envelope is not None
    envelope = TaskEnvelope.from_dict(record.envelope, default_tenant="default")
    lease = tasks.acquire(envelope, worker_id="w", lease_seconds=60, max_attempts=3)
    tasks.finalize(lease, TaskState.COMPLETED, fields={"costUsd": 0.010705000000000001})

    shown = agentq(shell, "status", request_id)
    assert "$0.0107" in shown.stdout and "0.010705000000000001" not in shown.stdout
    assert agentq(shell, "status", request_id, "--json").json()["costUsd"] == pytest.approx(
        0.010705
    )
    recent = agentq(shell, "watch", "--once")  # no stored events here: the hint, exit 0
    assert recent.code == 0


def test_result_of_a_task_without_one_exits_as_the_exit_table_says(stack: Stack) -> None:
    """Ended without a result (CANCELLED here): 4, as `status` and `--wait` say of such
    a task; not finished yet: 3, nothing to find yet. Never 6: the id was valid."""
    shell = fresh_shell(**stack.env(), TASK_DEFINITIONS_DIR=fast_env()["TASK_DEFINITIONS_DIR"])
    waiting = agentq(shell, "submit", "sample-echo", "--input", "{}").stdout.strip()
    not_yet = agentq(shell, "result", waiting, "--json")
    assert not_yet.code == 3, not_yet
    assert not_yet.json()["error"]["kind"] == "not_found"
    assert f"task {waiting} is PENDING: no result yet" in one_line_error(not_yet)

    cancel = agentq(shell, "cancel", waiting)
    assert (cancel.code, cancel.stdout.strip()) == (0, f"cancelled: {waiting}"), cancel
    ended = agentq(shell, "result", waiting, "--json")
    assert ended.code == 4, ended
    assert ended.json()["error"]["kind"] == "task_failed"
    assert f"task {waiting} ended CANCELLED: no result" in one_line_error(ended)
    assert agentq(shell, "status", waiting).code == 4  # the same answer
