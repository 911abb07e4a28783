"""Every task has a page from the moment it exists: its state and why it waits, in the
console and in `agentq status` / `agentq logs`, whether or not an attempt left files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from cli_support import Ran, agentq
from conftest import Stack
from console_support import Http, browser, define, running_console, signed_in
from playwright.sync_api import Browser

from agentq.client import AgentqClient
from agentq.console import ConsoleServer
from bench.console_states import tasks_in_each_state

__all__ = ["browser"]


@pytest.fixture
def tasks(inproc_stack: Stack) -> dict[str, tuple[str, str]]:
    """(request id, tenant) of a task in each state no worker needs to reach."""
    define(inproc_stack, "noop")
    return tasks_in_each_state(AgentqClient.from_env(), "noop")


@pytest.fixture
def http(tasks: dict[str, tuple[str, str]]) -> Iterator[Http]:
    server: ConsoleServer
    with running_console() as server:
        client = Http(server)
        client.sign_in()
        yield client


EXPECTED = {
    "pending": ("PENDING", "queued: first in tier normal, waiting for a free worker slot"),
    "scheduled": ("SCHEDULED", "scheduled: starts at "),
    "cancelled": ("CANCELLED", None),
    "processing": ("PROCESSING", "running: attempt 1 on w-test, lease until "),
    "blocked": ("BLOCKED", "blocked: waiting for first"),
    "at-limit": ("PENDING", "queued: tenant busy is at its limit (1 of 1 running)"),
    "timeout": ("TIMEOUT", None),
    "failed": ("FAILED", None),
    "retrying": ("RETRYING", "retrying: attempt 1 failed (network); the next attempt starts"),
    "completed": ("COMPLETED", None),
    "rejected": ("FAILED", None),
}
# What the page says of a retryable error the task did not retry.
RETRY_NOTES = {
    "timeout": "its deadline passed: a timeout ends the task, not retried",
    "failed": "retryable, but no attempt was left",
    "rejected": "input.document: field required",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_task_in_any_state_has_a_page_that_says_why_it_waits(
    name: str, tasks: dict[str, tuple[str, str]], http: Http
) -> None:
    request_id, tenant = tasks[name]
    state, why = EXPECTED[name]
    reply = http.request("GET", f"/api/tasks/{request_id}?tenant={tenant}")
    assert reply.status == 200, reply.text[:500]
    data = reply.json()
    assert data["task"]["state"] == state
    if why is None:
        assert data["waiting"] is None
    else:
        assert data["waiting"].startswith(why), data["waiting"]
    said = data["artifacts"]["resultState"]
    assert any(words in said for words in ("no output yet", "left no output", "no result yet",
                                           "left no result")), said  # fmt: skip
    page = http.request("GET", f"/tasks/{request_id}?tenant={tenant}")
    assert page.status == 200


def test_chromium_shows_each_state_and_why_on_the_task_page(
    tasks: dict[str, tuple[str, str]], browser: Browser
) -> None:
    with running_console(allow_actions=True) as server:
        page = signed_in(browser, server)
        for name, (request_id, tenant) in sorted(tasks.items()):
            state, why = EXPECTED[name]
            page.goto(f"{server.base_url}/tasks/{request_id}?tenant={tenant}")
            page.wait_for_selector("body[data-page='task'] #task-state")
            assert state in page.inner_text("#task-state"), name
            if why is None:
                assert page.query_selector("#waiting") is None, name
            else:
                assert page.inner_text("#waiting").startswith(why), name
            assert "Not found" not in page.inner_text("body"), name
            if name in RETRY_NOTES:
                assert RETRY_NOTES[name] in page.inner_text("#error"), name
            ended = state in ("CANCELLED", "FAILED", "TIMEOUT", "COMPLETED")
            logs = page.inner_text("#logs")
            assert logs == ("no logs" if ended else "no logs yet"), (name, logs)
        # A message rejected at receive has no definition to run again.
        request_id, tenant = tasks["rejected"]
        page.goto(f"{server.base_url}/tasks/{request_id}?tenant={tenant}")
        page.wait_for_selector("body[data-page='task'] #task-state")
        assert page.inner_text("#attempts") == "no attempt ran"
        assert page.query_selector("text=Resubmit as a new task") is None
        request_id, tenant = tasks["failed"]
        page.goto(f"{server.base_url}/tasks/{request_id}?tenant={tenant}")
        page.wait_for_selector("text=Resubmit as a new task")
        # Its attempt was locked (the STATE item counts it) but no worker stored events.
        assert page.inner_text("#attempts") == "attempt 1 locked; its events are not stored yet"


def _agentq(stack: Stack, *args: str) -> Ran:
    return agentq({**os.environ, **stack.env(), "COLUMNS": "200"}, *args)


def test_status_and_logs_say_no_output_yet_instead_of_not_found(stack: Stack) -> None:
    define(stack, "noop")
    client = AgentqClient.from_env()
    pending = client.submit("noop", {"n": 1}, delay=600).request_id
    status = _agentq(stack, "status", pending)
    assert status.code == 0, status.stderr
    assert "scheduled: starts at" in status.stdout
    assert json.loads(_agentq(stack, "status", pending, "--json").stdout)["waiting"].startswith(
        "scheduled:"
    )
    logs = _agentq(stack, "logs", pending)
    assert logs.code == 0, logs.stderr
    assert "is SCHEDULED and has no output yet" in logs.stdout
    assert "not found" not in logs.stdout + logs.stderr
    assert json.loads(_agentq(stack, "logs", pending, "--json").stdout) == {}
    trace = _agentq(stack, "trace", pending)
    assert trace.code == 0 and "has no output yet" in trace.stdout


def test_a_failed_jobs_progress_bar_is_not_all_green(inproc_stack: Stack, browser: Browser) -> None:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    client.create_job({"tasks": {"a": {"definition": "noop"}, "b": {"definition": "noop"}}},
                      job_id="doomed")  # fmt: skip
    client.cancel(job_id="doomed")
    with running_console() as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/jobs")
        page.wait_for_selector("#jobs tr[data-job='doomed']")
        bar = "#jobs tr[data-job='doomed'] .progress"
        widths = page.eval_on_selector_all(f"{bar} > span",
                                           "spans => spans.map(s => [s.className, s.style.width])")  # fmt: skip
        assert dict(widths) == {"ok": "0%", "bad": "0%", "off": "100%"}, widths
        assert "2 cancelled" in (page.get_attribute(bar, "title") or "")
