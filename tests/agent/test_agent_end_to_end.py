"""Agent tasks end to end: real worker, real SDK, the bundled CLI, the offline model server.

Each test costs one to three CLI runs (~1 s CPU and ~240 MB each): the scenarios are
chosen so every "must show" item of agent execution is covered by few runs.
"""

from __future__ import annotations

import json

import psutil
import pytest
from agent_support import NOTE_SCHEMA, agent_definition, agent_rig, processes_using
from conftest import Stack
from jsonschema import Draft202012Validator
from support import wait_for

from agentq.states import TaskState
from agentq.store.tasks import TaskStore

pytestmark = pytest.mark.timeout(240)

TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def _state(stack: Stack, request_id: str) -> object:
    record = TaskStore(stack.dynamodb, stack.resources.table_name).get("acme", request_id)
    assert record is not None
    return record


def test_agent_task_completes_with_valid_output_usage_cost_and_a_faithful_trace(
    stack: Stack,
) -> None:
    definition = agent_definition(
        "note", settings={"allowed_tools": ["Bash", "TaskCreate", "TaskUpdate"]}
    )
    script = (
        '[[model: key happy; tool Bash {"command": "echo agentq-was-here"}; '
        'tool TaskCreate {"subject": "read the text", "description": "read it", '
        '"activeForm": "reading"}; tool TaskUpdate {"taskId": "1", "status": "in_progress"}; '
        'tool TaskUpdate {"taskId": "1", "status": "completed"}]]'
    )
    # Newer CLIs only offer the task tools when asked to.
    with agent_rig(stack, [definition], extra_env={"CLAUDE_CODE_ENABLE_TODO_TOOLS": "1"}) as rig:
        task = rig.send("note", {"text": f"Queues decouple producers from workers. {script}"})
        completed = rig.events.wait(task.request_id, "Task Completed")[0]
        wait_for(lambda: rig.queue_counts() == (0, 0), message="message deleted")
        requests = rig.model.requests("happy")

    # The structured output is in S3 and valid against the definition's schema.
    files = rig.s3_files(task.request_id)
    result = rig.s3_json(completed["payload"]["result"]["key"])
    assert not list(Draft202012Validator(NOTE_SCHEMA).iter_errors(result))
    assert "artifacts/task-result.json" in files
    record = _state(stack, task.request_id)
    assert record.state is TaskState.COMPLETED  # type: ignore[attr-defined]

    # Usage on the event adds up what the model server answered, request by request.
    answered = [r for r in requests if r.status == 200 and r.usage]
    assert [r.outcome for r in answered] == [
        "tool_use:Bash",
        "tool_use:TaskCreate",
        "tool_use:TaskUpdate",
        "tool_use:TaskUpdate",
        "tool_use:StructuredOutput",
    ]
    payload = completed["payload"]
    for name in TOKENS:
        assert payload["usage"][name] == sum(r.usage[name] for r in answered if r.usage), name
    cost = payload.get("cost_usd", payload.get("costUsd"))
    assert isinstance(cost, float) and cost > 0

    # The trace tells the same story: the tool calls in order, tokens, cache, todos.
    trace = rig.s3_json(rig.prefix(task.request_id) + "traces/session_trace.json")
    assert trace["outcome"] == "completed"
    assert [c["name"] for c in trace["tool_calls"]] == [
        "Bash",
        "TaskCreate",
        "TaskUpdate",
        "TaskUpdate",
        "StructuredOutput",
    ]
    assert all(c["status"] == "ok" and c["duration_ms"] >= 0 for c in trace["tool_calls"])
    bash = trace["tool_calls"][0]
    assert bash["input_bytes"] == len('{"command": "echo agentq-was-here"}')
    assert bash["output_bytes"] > len("agentq-was-here")
    assert trace["usage"] == payload["usage"]
    assert trace["num_turns"] == len(answered) + 1  # + the final text turn
    assert [t["tools"] for t in trace["turns"]][: len(answered)] == [
        [r.outcome.split(":", 1)[1]] for r in answered
    ]
    for turn, request in zip(trace["turns"], answered, strict=False):
        # Input and cache figures arrive with message_start, so each turn matches its request.
        assert turn["usage"]["input_tokens"] == request.usage["input_tokens"]  # type: ignore[index]
    usage = trace["usage"]
    prompt_tokens = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    assert trace["cache_efficiency_pct"] == round(
        100 * usage["cache_read_input_tokens"] / prompt_tokens, 1
    )
    (todo,) = trace["todos"]
    assert todo["content"] == "read the text" and todo["state"] == "completed"
    seen = todo["first_seen_ms"]
    assert seen["pending"] <= seen["in_progress"] <= seen["completed"]
    assert [a["outcome"] for a in trace["attempts"]] == ["success"]

    summary = files["logs/summary.log"]
    assert "outcome: completed" in summary and "Bash x1" in summary
    assert "todos: 1, 1 completed" in summary


def test_agent_retries_inside_the_child_and_then_through_sqs_to_the_dlq(stack: Stack) -> None:
    # "flaky" makes one CLI run per worker attempt (retry_attempts 1) to keep the run count
    # down; max_attempts above the queue's maxReceiveCount lets SQS dead-letter it.
    definitions = [
        agent_definition("note"),
        agent_definition("flaky", max_attempts=5, settings={"retry_attempts": 1}),
    ]
    with agent_rig(stack, definitions) as rig:
        busy = rig.send("note", {"text": "Hello [[model: key busy; fail 429 x2]]"})
        down = rig.send("flaky", {"text": "Hello [[model: key down; fail 500]]"})
        completed = rig.events.wait(busy.request_id, "Task Completed")[0]
        failures = rig.events.wait(down.request_id, "Task Processing Failed", count=3)
        wait_for(
            lambda: rig.queue_counts(stack.resources.dlq_url)[0] == 1,
            timeout=60,
            message="message in the DLQ",
        )
        busy_statuses = [r.status for r in rig.model.requests("busy")]
        down_requests = rig.model.requests("down")

    # 429 twice, then success: one worker-level attempt, the retries were the child's.
    assert busy_statuses[:3] == [429, 429, 200]
    assert completed["attempt"] == 1
    assert not rig.events.of(busy.request_id, "Task Processing Failed")
    trace = rig.s3_json(rig.prefix(busy.request_id) + "traces/session_trace.json")
    assert [a["outcome"] for a in trace["attempts"]] == ["rate_limit", "rate_limit", "success"]
    assert trace["attempts"][0]["error"]["retryable"] is True

    # 500 every time: each worker attempt fails retryably, SQS redelivers, then dead-letters.
    assert [f["attempt"] for f in failures] == [1, 2, 3]
    assert {f["payload"]["error"]["category"] for f in failures} == {"server"}
    assert len(down_requests) == 3
    assert not rig.events.of(down.request_id, "Task Completed")


def _name(process: psutil.Process) -> str:
    try:
        return str(process.name())
    except psutil.Error:
        return ""  # gone since it was listed


def test_agent_auth_parse_stall_and_step_timeout_end_the_task_for_good(stack: Stack) -> None:
    definitions = [
        agent_definition("note"),
        # The stalled run is stopped by the worker's child timeout, not the step timeout.
        # Long enough for its CLI to start and ask on a loaded host (CI runs eight test
        # processes on two cores) before the worker stops it.
        agent_definition("slow", timeout_s=45, settings={"step_timeout_s": 120}),
        # Here the child's own step timeout fires first: a cancellation, classified. Long
        # enough for the CLI to start and ask on a loaded machine, shorter than `slow`'s.
        agent_definition(
            "impatient", max_attempts=1, settings={"step_timeout_s": 30, "retry_attempts": 1}
        ),
    ]
    liar = '[[model: key liar; output {"title": "t", "points": [], "score": 99}]]'
    with agent_rig(stack, definitions, CLAUDE_KILL_GRACE="1000") as rig:
        locked = rig.send("note", {"text": "Hello [[model: key locked; fail 401]]"})
        stuck = rig.send("slow", {"text": "Hello [[model: key stuck; stall]]"})
        bad = rig.send("note", {"text": f"Hello {liar}"})
        hasty = rig.send("impatient", {"text": "Hello [[model: key hasty; stall]]"})
        url, worker = rig.model.url, rig.worker.pid
        wait_for(lambda: rig.model.requests("stuck"), timeout=90, message="the CLI asked")
        # Another task's CLI may end between the listing and its name (psutil then raises).
        cli = [p for p in processes_using(url, besides=worker) if "claude" in _name(p)]
        assert cli, "the stalled CLI is running"
        auth = rig.events.wait(locked.request_id, "Task Failed")[0]
        parse = rig.events.wait(bad.request_id, "Task Failed")[0]
        rig.events.wait(stuck.request_id, "Task Timeout")
        hasty_failed = rig.events.wait(hasty.request_id, "Task Failed")[0]
        wait_for(lambda: rig.queue_counts() == (0, 0), message="messages deleted")
        wait_for(
            lambda: not processes_using(url, besides=worker),
            timeout=20,
            message="no CLI process left",
        )
        locked_requests = rig.model.requests("locked")

    # 401: terminal at once, nobody retries it.
    assert auth["payload"]["error"]["category"] == "auth"
    assert auth["payload"]["error"]["retryable"] is False
    assert len(locked_requests) == 1
    # An attempt that failed before its CLI asked (a loaded host: its lease or start-up
    # ran out) may precede it; the 401 itself is never retried.
    earlier = rig.events.of(locked.request_id, "Task Processing Failed")
    assert all(e["payload"]["error"]["category"] != "auth" for e in earlier), earlier
    assert auth["attempt"] == len(earlier) + 1, earlier
    assert _state(stack, locked.request_id).state is TaskState.FAILED  # type: ignore[attr-defined]

    # Output that breaks the schema is a parse failure, never a result.
    assert parse["payload"]["error"]["category"] == "parse"
    assert not rig.events.of(bad.request_id, "Task Completed")
    assert "artifacts/task-result.json" not in rig.s3_files(bad.request_id)

    # A stalled model: the worker's timeout, and the CLI died with the child.
    assert _state(stack, stuck.request_id).state is TaskState.TIMEOUT  # type: ignore[attr-defined]
    # A step timeout inside the child is a cancellation, classified as a timeout.
    assert rig.model.requests("hasty"), "the CLI reached the model before the deadline"
    assert hasty_failed["payload"]["error"]["category"] == "timeout"
    hasty_trace = rig.s3_json(rig.prefix(hasty.request_id) + "traces/session_trace.json")
    assert [a["outcome"] for a in hasty_trace["attempts"]] == ["timeout"]
    assert "exceeded 30 s" in hasty_trace["attempts"][0]["error"]["message"]

    # The child used the kill grace to leave its trace and summary for the operator.
    stuck_files = rig.s3_files(stuck.request_id)
    assert "stopped by the worker" in stuck_files["logs/summary.log"]
    stuck_trace = json.loads(stuck_files["traces/session_trace.json"])
    assert stuck_trace["outcome"] == "stopped" and stuck_trace["error"]["category"] == "timeout"


def test_a_structured_answer_the_cli_keeps_refusing_is_a_parse_failure(stack: Stack) -> None:
    # The CLI refuses a StructuredOutput of the wrong shape and asks again; the model keeps
    # answering wrongly until max_turns runs out. The cause is the schema, not max_turns.
    definitions = [agent_definition("note", max_attempts=1, settings={"max_turns": 3})]
    with agent_rig(stack, definitions) as rig:
        bad = rig.send("note", {"text": 'Hello [[model: key typed; output {"title": 5}]]'})
        failed = rig.events.wait(bad.request_id, "Task Failed", timeout=150)[0]
    error = failed["payload"]["error"]
    assert error["category"] == "parse", error
    assert "did not match the output schema" in error["message"]
    assert "refused before max_turns ran out" in error["message"]
