"""A child's usage.json and error.json are the task's word, not agentq's: whatever the
task code writes there, its attempt ends once, with what can be stored and nothing else.
Real worker and child processes against moto's server."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state

from agentq.states import TaskState

pytestmark = pytest.mark.timeout(180)

# usage.json text -> (usage kept, cost kept); None where nothing may be kept.
USAGE_FILES: list[tuple[str, Any, Any]] = [
    (
        '{"usage": {"input_tokens": 10, "server_tool_use": {"web_search_requests": 0}}, '
        '"cost_usd": 0.25}',
        {"input_tokens": 10, "server_tool_use": {"web_search_requests": 0}},
        0.25,
    ),
    ('{"usage": {"": 1}, "cost_usd": 0.5}', None, 0.5),  # DynamoDB refuses an empty key
    ('{"usage": {"input_tokens": 1e400}, "cost_usd": 1e999}', None, None),  # infinity
    ('{"usage": {"input_tokens": NaN}}', None, None),
    ('{"usage": {"input_tokens": ' + "9" * 50 + '}, "cost_usd": -3}', None, None),
    ('{"usage": {"x": "\\ud800"}, "cost_usd": "free"}', None, None),  # a lone surrogate
    ('{"usage": [1, 2], "cost_usd": true}', None, None),
    ('{"usage": {"x": "' + "y" * 20_000 + '"}}', None, None),  # too large to send
    ("[" * 5_000 + "]" * 5_000, None, None),
    ("\xff not text", None, None),
]


def test_whatever_usage_json_holds_the_task_completes_once(stack: Stack) -> None:
    events = EventLog(stack)
    with running_worker(stack) as worker:
        tasks = [send(stack, "sample-artifacts", {"files": {"usage.json": text}})
                 for text, _, _ in USAGE_FILES]  # fmt: skip
        # A FIFO in its place would block a reader that opened it without O_NONBLOCK.
        fifo = send(stack, "sample-artifacts", {"fifos": ["usage.json"]})
        for task in [*tasks, fifo]:
            events.wait(task.request_id, "Task Completed")
        wait_for(lambda: queue_counts(stack) == (0, 0), message="messages deleted")
        worker.stop()
        output = worker.output()
    for task, (_, usage, cost) in zip(tasks, USAGE_FILES, strict=True):
        record = state(stack, task)
        assert record is not None and record.state is TaskState.COMPLETED
        assert record.attempt == 1  # ran once: the final write was not refused
        assert record.raw.get("usage") == usage, task.request_id
        assert record.raw.get("costUsd") == cost, task.request_id
        [completed] = events.of(task.request_id, "Task Completed")
        assert completed["payload"].get("usage") == usage
        assert completed["payload"].get("cost_usd") == cost
    record = state(stack, fifo)
    assert record is not None and record.state is TaskState.COMPLETED
    assert "usage" not in record.raw
    ignored = output.count('"message":"child file ignored"')
    assert ignored >= len(USAGE_FILES) - 1, ignored
    assert "yyyy" not in output and "9999999999" not in output  # named, not quoted


def test_a_task_that_writes_its_own_error_record_fails_once_with_it_scrubbed(
    stack: Stack,
) -> None:
    events = EventLog(stack)
    record_text = ('{"category": "validation", "message": "bad \\ud800 input", '
                   '"exception_type": "' + "E" * 5_000 + '"}')  # fmt: skip
    with running_worker(stack) as worker:
        task = send(stack, "sample-artifacts",
                    {"files": {"error.json": record_text}, "exit_code": 3})  # fmt: skip
        failed = events.wait(task.request_id, "Task Failed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    error = failed["payload"]["error"]
    assert error["category"] == "validation" and error["retryable"] is False
    assert error["message"] == "bad \ufffd input"
    assert 0 < len(error["exception_type"]) <= 200
    record = state(stack, task)
    assert record is not None and record.state is TaskState.FAILED and record.attempt == 1
    assert record.raw["error"] == error
