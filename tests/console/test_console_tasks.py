"""The console's Tasks page: a tenant's tasks submitted on their own, found through its
stored events, at two AWS requests a refresh, and drawn as text in Debian's chromium."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Stack
from console_support import Http, browser, define, running_console, signed_in
from playwright.sync_api import Browser
from support import store_events

from agentq.aws import AwsClients, CallCounter
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console import ConsoleOptions, ConsoleServer
from agentq.console.server import build_parts

__all__ = ["browser"]
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@pytest.fixture
def work(inproc_stack: Stack) -> dict[str, str]:
    """Two tasks of the default tenant on their own (one cancelled with a hostile reason),
    a job's task, and another tenant's task; their events stored."""
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    first = client.submit("noop", {"n": 1}).request_id
    second = client.submit("noop", {"n": 2}).request_id
    client.cancel(second, reason=HOSTILE)
    client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id="a-job")
    other = client.submit("noop", {"n": 3}, tenant="acme").request_id
    store_events(inproc_stack)
    return {"first": first, "second": second, "other": other}


@pytest.fixture
def counted(work: dict[str, str]) -> Iterator[tuple[Http, CallCounter]]:
    settings = Settings.from_env()
    counter = CallCounter()
    aws = AwsClients(settings.region, counter=counter)
    with ConsoleServer(build_parts(settings, aws, ConsoleOptions())) as server:
        http = Http(server)
        http.sign_in()
        yield http, counter


def test_the_tasks_page_lists_a_tenants_own_tasks_newest_first_and_no_jobs(
    work: dict[str, str], counted: tuple[Http, CallCounter]
) -> None:
    http, counter = counted
    before = counter.snapshot()
    page = http.request("GET", "/api/tasks").json()
    calls = {op: n - before.get(op, 0) for op, n in counter.snapshot().items()}
    assert [row["requestId"] for row in page["tasks"]] == [work["second"], work["first"]]
    second, first = page["tasks"]
    assert (second["state"], second["cancelReason"]) == ("CANCELLED", HOSTILE)
    assert (first["state"], first["definition"], first["attempt"]) == ("PENDING", "noop", 0)
    assert page["more"] is False and page["scanned"] > 0
    # However many events the tenant has: one index query and one batch read.
    assert {op: n for op, n in calls.items() if n} == {
        "dynamodb:Query": 1,
        "dynamodb:BatchGetItem": 1,
    }
    acme = http.request("GET", "/api/tasks?tenant=acme").json()
    assert [row["requestId"] for row in acme["tasks"]] == [work["other"]]
    assert http.request("GET", "/api/tasks?tenant=no%20such").status == 400


@pytest.mark.e2e
def test_the_tasks_page_draws_untrusted_text_as_text(
    work: dict[str, str], browser: Browser
) -> None:
    with running_console() as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/tasks")
        page.wait_for_selector("#standalone")
        rows = page.eval_on_selector_all(
            "#standalone tbody tr", "rows => rows.map(row => row.dataset.request)"
        )
        assert rows == [work["second"], work["first"]]
        assert HOSTILE in page.inner_text("#standalone")
        assert page.evaluate("window.__xss") is None
        page.click(f"#standalone a[href*='{work['first']}']")
        page.wait_for_selector("body[data-page='task']")
        assert work["first"] in page.url
