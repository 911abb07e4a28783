"""Search and filters on the Tasks and Jobs pages: by state, definition, part of an id
and time range, reflected in the URL, validated before any AWS call, drawn as text."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from conftest import Stack
from console_support import Http, browser, define, running_console, signed_in
from playwright.sync_api import Browser
from support import store_events

from agentq.client import AgentqClient
from agentq.console import ConsoleServer

__all__ = ["browser"]
HOSTILE = '<img src=x onerror="window.__xss=1">'


@pytest.fixture
def work(inproc_stack: Stack) -> dict[str, str]:
    define(inproc_stack, "noop", "other")
    client = AgentqClient.from_env()
    found = {
        "alpha": client.submit("noop", {"n": 1}).request_id,
        "beta": client.submit("other", {"n": 2}).request_id,
        "gamma": client.submit("noop", {"n": 3}).request_id,
    }
    client.cancel(found["gamma"])
    client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id="search-job-a")
    client.create_job({"tasks": {"b": {"definition": "other"}}}, job_id="search-job-b")
    store_events(inproc_stack)
    return found


@pytest.fixture
def http(work: dict[str, str]) -> Iterator[Http]:
    server: ConsoleServer
    with running_console() as server:
        client = Http(server)
        client.sign_in()
        yield client


def _ids(http: Http, query: str, key: str = "tasks", field: str = "requestId") -> list[str]:
    reply = http.request("GET", f"/api/{key}?{query}")
    assert reply.status == 200, reply.text[:300]
    return [row[field] for row in reply.json()[key]]


def test_the_tasks_page_searches_by_id_state_definition_and_time(
    work: dict[str, str], http: Http
) -> None:
    alpha, beta, gamma = work["alpha"], work["beta"], work["gamma"]
    assert set(_ids(http, "")) == {alpha, beta, gamma}
    assert _ids(http, f"q={beta[3:-3]}") == [beta]
    assert _ids(http, "state=CANCELLED") == [gamma]
    assert _ids(http, "state=PENDING&definition=noop") == [alpha]
    assert _ids(http, "definition=other") == [beta]
    assert _ids(http, "since=2999-01-01T00:00") == []
    assert _ids(http, "until=2001-01-01") == []
    assert _ids(http, f"since=2001-01-01T00:00Z&q={alpha}") == [alpha]
    # A whole request id finds the task even in a job (not listed otherwise).
    job_task = "search-job-a-a"
    assert _ids(http, f"q={job_task}") == [job_task]
    echoed = http.request("GET", "/api/tasks?q=alpha&state=PENDING").json()["filters"]
    assert (echoed["q"], echoed["state"]) == ("alpha", "PENDING")


def test_the_jobs_page_searches_by_id_definition_and_time(http: Http) -> None:
    jobs = "jobs"
    assert _ids(http, "", jobs, "jobId") == ["search-job-b", "search-job-a"]
    assert _ids(http, "q=job-a", jobs, "jobId") == ["search-job-a"]
    assert _ids(http, "definition=other", jobs, "jobId") == ["search-job-b"]
    assert _ids(http, "state=RUNNING&definition=noop", jobs, "jobId") == ["search-job-a"]
    assert _ids(http, "since=2999-01-01", jobs, "jobId") == []
    assert _ids(http, "until=2999-01-01&since=2001-01-01", jobs, "jobId") == [
        "search-job-b", "search-job-a"]  # fmt: skip


@pytest.mark.parametrize("query", [
    "q=" + quote(HOSTILE), "state=DONE", "definition=" + quote("a b"),
    "since=yesterday", "since=2026-12-02&until=2026-12-01", "until=" + quote("2026-13-01"),
])  # fmt: skip
def test_bad_filters_are_refused_before_any_read(http: Http, query: str) -> None:
    for path in ("/api/tasks", "/api/jobs", "/tasks", "/jobs"):
        reply = http.request("GET", f"{path}?{query}")
        assert reply.status == 400, (path, query, reply.text[:200])
        assert HOSTILE not in reply.text


@pytest.mark.e2e
def test_chromium_search_lives_in_the_url_and_draws_text(
    work: dict[str, str], browser: Browser
) -> None:
    with running_console() as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/tasks")
        page.wait_for_selector("#standalone")
        part = work["gamma"][2:-2]
        page.fill("#filters input[name=q]", part)
        page.select_option("#filters select[name=state]", "CANCELLED")
        page.click("#filters button[type=submit]")
        page.wait_for_url(f"**/tasks?*q={part}*")
        page.wait_for_selector("#standalone")
        assert "state=CANCELLED" in page.url
        rows = page.eval_on_selector_all(
            "#standalone tbody tr", "r => r.map(x => x.dataset.request)"
        )
        assert rows == [work["gamma"]]
        # The URL alone reproduces the search (a link to share), the form shows it again.
        shared = signed_in(browser, server)
        shared.goto(page.url)
        shared.wait_for_selector("#standalone")
        assert shared.input_value("#filters input[name=q]") == part
        assert shared.input_value("#filters select[name=state]") == "CANCELLED"
        # A hostile value never reaches the page as markup: it is refused.
        shared.goto(f"{server.base_url}/jobs?q={quote(HOSTILE)}")
        assert "Bad request" in shared.inner_text("main")
        assert shared.evaluate("window.__xss") is None
        shared.goto(f"{server.base_url}/jobs?definition=other")
        shared.wait_for_selector("#jobs")
        jobs = shared.eval_on_selector_all("#jobs tbody tr", "r => r.map(x => x.dataset.job)")
        assert jobs == ["search-job-b"]


def test_a_search_stops_reading_once_a_page_of_tasks_matches(inproc_stack: Stack) -> None:
    """120 FAILED tasks whose failures fill 1 MB pages of about 90: a state search reads
    the newest page, checks its tasks' STATE items and stops there with 50 rows, the
    newest 50 (1 Query and 1 BatchGetItem, not every page of the range)."""
    from agentq.console.search import TASK_STATES, parse_filters
    from agentq.console.standalone import SHOWN, StandaloneTasks
    from agentq.events import task_event
    from agentq.states import TaskState

    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    tenant = client.settings.tenant_id
    made: list[str] = []
    for n in range(120):
        envelope = client.submit("noop", {"n": n})
        client.tasks.transition(tenant, envelope.request_id, from_states=[TaskState.PENDING],
                                to_state=TaskState.FAILED)  # fmt: skip
        client.event_store.append(task_event(
            "Task Failed", request_id=envelope.request_id, tenant=tenant, detail="x" * 11_000,
        ))  # fmt: skip
        made.append(envelope.request_id)
    store_events(inproc_stack)
    calls: list[str] = []
    client.dynamodb.meta.events.register(
        "before-call.dynamodb", lambda model, **_: calls.append(model.name)
    )
    page = StandaloneTasks(client).search(tenant, parse_filters({"state": "FAILED"},
                                                                states=TASK_STATES))  # fmt: skip
    assert [row["requestId"] for row in page["tasks"]] == made[::-1][:SHOWN]
    assert page["more"] is True and SHOWN <= page["scanned"] < 2 * 120  # of 240 events
    assert calls == ["Query", "BatchGetItem"]
