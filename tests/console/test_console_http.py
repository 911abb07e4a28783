"""The console over plain HTTP: the token and cookie, 403s, 404s, CSRF, ETags, paging."""

from __future__ import annotations

import base64
import html
import re
import socket
from collections.abc import Iterator

import pytest
from conftest import Stack
from console_support import Http, define, running_console
from support import EventLog

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console import ConsoleServer
from agentq.console.server import ConsoleOptions
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store.keys import attempt_prefix
from agentq.store.workers import RosterAnnouncer, WorkerRoster


@pytest.fixture
def readonly(inproc_stack: Stack) -> Iterator[ConsoleServer]:
    with running_console() as server:
        yield server


@pytest.fixture
def acting(inproc_stack: Stack) -> Iterator[ConsoleServer]:
    with running_console(allow_actions=True) as server:
        yield server


def test_every_path_is_forbidden_without_the_token(readonly: ConsoleServer) -> None:
    http = Http(readonly)
    for path in ("/jobs", "/jobs/x", "/tasks/x", "/dlq", "/queues", "/api/jobs",
                 "/static/console.js", "/"):  # fmt: skip
        assert http.request("GET", path).status == 403, path
    assert http.request("GET", "/jobs?token=not-the-token").status == 403
    assert http.request("GET", "/api/jobs").json()["error"] == "forbidden"
    # A made-up cookie is no better than none.
    for forged in ("forged", "é-not-ascii"):
        http.cookie = f"agentq_console_{readonly.port}={forged}"
        assert http.request("GET", "/jobs").status == 403


def test_the_token_is_traded_for_a_cookie_and_dropped_from_the_address(
    readonly: ConsoleServer,
) -> None:
    http = Http(readonly)
    reply = http.request("GET", f"/jobs?state=RUNNING&token={readonly.parts.gate.token}")
    assert reply.status == 303
    assert reply.headers["location"] == "/jobs?state=RUNNING"
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    http.cookie = reply.headers["set-cookie"].split(";", 1)[0]
    page = http.request("GET", "/jobs?state=RUNNING")
    assert page.status == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "no-referrer"


def test_the_token_redirect_stays_on_the_console(readonly: ConsoleServer) -> None:
    reply = Http(readonly).request("GET", f"//evil.example/x?token={readonly.parts.gate.token}")
    assert reply.status == 303
    assert reply.headers["location"] == "/evil.example/x"


def test_a_foreign_host_name_is_refused_even_with_the_cookie(readonly: ConsoleServer) -> None:
    http = Http(readonly)
    http.sign_in()
    # DNS rebinding: a hostile name resolving to 127.0.0.1 gets nothing.
    reply = http.request("GET", "/api/jobs", headers={"Host": f"evil.example:{readonly.port}"})
    assert reply.status == 403


def test_unknown_ids_give_a_page_that_says_so(readonly: ConsoleServer) -> None:
    http = Http(readonly)
    http.sign_in()
    for path, what in (
        ("/jobs/no-such-job", "no-such-job"),
        ("/tasks/no-such-task", "no-such-task"),
    ):
        page = http.request("GET", path)
        assert page.status == 404, path
        assert "Not found" in page.text and what in page.text
        assert http.request("GET", "/api" + path).status == 404
    # An id that is not even valid is a bad request, and its echo is escaped.
    page = http.request("GET", "/tasks/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert page.status == 400
    assert "<img" not in page.text and "&lt;img" in page.text
    assert http.request("GET", "/api/jobs?cursor=garbage").status == 400
    # Brackets 3,000 deep, under the cursor's length limit: a 400 too, never a 500.
    deep = base64.urlsafe_b64encode(b"[" * 3000).decode().rstrip("=")
    assert http.request("GET", f"/api/jobs?cursor={deep}").status == 400
    assert http.request("GET", "/api/jobs?state=MAYBE").status == 400
    assert http.request("GET", "/api/jobs?limit=100000").status == 400


def test_actions_are_refused_unless_the_console_allows_them(
    inproc_stack: Stack, readonly: ConsoleServer
) -> None:
    define(inproc_stack, "noop")
    task = AgentqClient.from_env().submit("noop", {})
    http = Http(readonly)
    http.sign_in()
    reply = http.act("cancel", {"requestId": task.request_id}, csrf=http.csrf())
    assert reply.status == 403
    assert "--allow-actions" in reply.json()["detail"]
    assert AgentqClient.from_env().get_task(task.request_id).state is TaskState.PENDING


def test_actions_need_the_csrf_token_and_are_recorded_with_the_operator(
    inproc_stack: Stack, acting: ConsoleServer
) -> None:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    task = client.submit("noop", {})
    http = Http(acting)
    http.sign_in()
    csrf = http.csrf()
    refused = [
        http.act("cancel", {"requestId": task.request_id}, csrf=None),
        http.act("cancel", {"requestId": task.request_id}, csrf="0" * 64),
        http.act("cancel", {"requestId": task.request_id}, csrf=csrf, content_type="text/plain"),
        http.act("cancel", {"requestId": task.request_id}, csrf=csrf, origin="http://evil.example"),
    ]
    assert [r.status for r in refused] == [403, 403, 403, 403]
    assert client.get_task(task.request_id).state is TaskState.PENDING
    # Without the cookie the CSRF token alone is worth nothing.
    http_without = Http(acting)
    assert http_without.act("cancel", {"requestId": task.request_id}, csrf=csrf).status == 403

    done = http.act("cancel", {"requestId": task.request_id}, csrf=csrf,
                    origin=f"http://127.0.0.1:{acting.port}")  # fmt: skip
    assert done.status == 200, done.text
    assert done.json() == {"cancelled": [task.request_id], "outcome": "cancelled"}
    assert client.get_task(task.request_id).state is TaskState.CANCELLED
    recorded = EventLog(inproc_stack).of(task.request_id, "Operator Action")
    assert len(recorded) == 1
    payload = recorded[0]["payload"]
    assert payload["action"] == "cancel"
    assert payload["operator"]["arn"].startswith("arn:aws:")
    assert "Secret" not in str(recorded[0]) and "AKIA" not in str(recorded[0])


def test_an_unchanged_page_costs_the_browser_a_304(
    inproc_stack: Stack, readonly: ConsoleServer
) -> None:
    http = Http(readonly)
    http.sign_in()
    first = http.request("GET", "/api/queues?x=1")
    etag = first.headers["etag"]
    second = http.request("GET", "/api/dlq", headers={"If-None-Match": etag})
    assert second.status == 200  # another document, another tag
    dlq = http.request("GET", "/api/dlq")
    again = http.request("GET", "/api/dlq", headers={"If-None-Match": dlq.headers["etag"]})
    assert again.status == 304 and again.body == b""
    # The page carries its data's tag, so its first poll of unchanged data is a 304.
    page = http.request("GET", "/dlq")
    tag = re.search(r'data-etag="([^"]*)"', page.text)
    assert tag is not None
    embedded = html.unescape(tag.group(1))
    assert http.request("GET", "/api/dlq", headers={"If-None-Match": embedded}).status == 304


def test_the_jobs_list_pages_newest_first_and_filters_by_state_and_tenant(
    inproc_stack: Stack, readonly: ConsoleServer
) -> None:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    for n in range(5):
        client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id=f"job-{n}")
    client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id="other", tenant="acme")
    http = Http(readonly)
    http.sign_in()
    seen: list[str] = []
    path = "/api/jobs?limit=2"
    while path:
        page = http.request("GET", path).json()
        assert len(page["jobs"]) <= 2
        seen += [job["jobId"] for job in page["jobs"]]
        path = f"/api/jobs?limit=2&cursor={page['next']}" if page["next"] else ""
    assert seen == [f"job-{n}" for n in reversed(range(5))]
    assert http.request("GET", "/api/jobs?state=COMPLETED").json()["jobs"] == []
    running = http.request("GET", "/api/jobs?state=RUNNING&limit=3").json()
    assert [j["state"] for j in running["jobs"]] == ["RUNNING"] * 3
    assert [j["jobId"] for j in http.request("GET", "/api/jobs?tenant=acme").json()["jobs"]] == [
        "other"
    ]
    # A rare state costs bounded reads: a short page and a cursor to go on from.
    jobs = AgentqClient.from_env().jobs
    page, last = jobs.page("default", limit=2, state="COMPLETED", max_queries=2)
    assert page == [] and last is not None
    # A cursor of one tenant's list is refused for another's.
    cursor = http.request("GET", "/api/jobs?limit=1").json()["next"]
    assert http.request("GET", f"/api/jobs?tenant=acme&cursor={cursor}").status == 400


def test_raw_objects_are_only_the_tasks_own_and_served_as_text(
    inproc_stack: Stack, readonly: ConsoleServer
) -> None:
    define(inproc_stack, "noop")
    task = AgentqClient.from_env().submit("noop", {})
    http = Http(readonly)
    http.sign_in()
    base = f"/api/tasks/{task.request_id}/object?name="
    assert http.request("GET", base + "../../dlq/archive/x.json").status == 400
    assert http.request("GET", base + "logs/none.log").status == 404  # no attempt yet
    # An attempt settles and its STATE item names its folder, as a worker's final write does.
    client = AgentqClient.from_env()
    record = client.tasks.require("default", task.request_id)
    envelope = TaskEnvelope.from_dict(dict(record.envelope or {}), default_tenant="default")
    lease = client.tasks.acquire(envelope, worker_id="w", lease_seconds=60, max_attempts=3)
    bucket = inproc_stack.resources.bucket
    named = {"bucket": bucket, "prefix": attempt_prefix("default", task.request_id, lease.attempt)}
    client.tasks.finalize(lease, TaskState.FAILED, fields={"artifacts": named})
    # Where the console looks for this task's objects: the folder the STATE item names.
    bucket, prefix = readonly.parts.reader.artifacts.outputs.location(
        client.tasks.require("default", task.request_id)
    )
    assert prefix == named["prefix"]
    inproc_stack.s3.put_object(Bucket=bucket, Key=prefix + "logs/a.log",
                               Body=b"<script>alert(1)</script>")  # fmt: skip
    reply = http.request("GET", base + "logs/a.log")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain")
    assert "sandbox" in reply.headers["content-security-policy"]


def test_an_aws_error_is_a_page_that_says_so_not_a_crash(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("S3_BUCKET", "agentq-no-such-bucket")
    with running_console() as server:
        http = Http(server)
        http.sign_in()
        reply = http.request("GET", "/api/dlq")
        assert reply.status == 502
        assert reply.json()["detail"] == "AWS answered NoSuchBucket; try again"
        page = http.request("GET", "/dlq")
        assert page.status == 502 and "AWS did not answer" in page.text


def test_the_queues_page_shows_depths_and_the_oldest_message_age_from_cloudwatch(
    inproc_stack: Stack, readonly: ConsoleServer
) -> None:
    define(inproc_stack, "noop")
    AgentqClient.from_env().submit("noop", {})
    queue = inproc_stack.resources.queue_url.rsplit("/", 1)[-1]
    cloudwatch = inproc_stack.aws_clients().get("cloudwatch")
    cloudwatch.put_metric_data(Namespace="AWS/SQS", MetricData=[{
        "MetricName": "ApproximateAgeOfOldestMessage", "Value": 42.0, "Unit": "Seconds",
        "Dimensions": [{"Name": "QueueName", "Value": queue}]}])  # fmt: skip
    http = Http(readonly)
    http.sign_in()
    roster = WorkerRoster(inproc_stack.dynamodb, inproc_stack.resources.table_name)
    RosterAnnouncer(roster, worker="w-idle", slots=3, busy=lambda: 0, version="9.9",
                    clock_ms=now_ms).tick()  # fmt: skip
    snapshot = http.request("GET", "/api/queues").json()
    # Every tier queue (as `agentq stats` lists them), then the DLQ.
    rows = {row["name"]: row for row in snapshot["queues"]}
    assert list(rows) == [*Settings.from_env().tier_queue_urls(), "dead letters"]
    tasks = next(r for r in snapshot["queues"] if r["url"] == inproc_stack.resources.queue_url)
    assert (tasks["depth"], tasks["inFlight"], tasks["oldestAgeS"]) == (1, 0, 42.0)
    dlq = rows["dead letters"]
    assert dlq["depth"] == 0 and dlq["oldestAgeS"] is None
    assert snapshot["oldestWaitingMs"]["PENDING"] >= 0
    (idle,) = snapshot["workers"]  # no task names it: the roster does
    assert (idle["worker"], idle["status"], idle["slots"], idle["version"]) == (
        "w-idle",
        "idle",
        3,
        "9.9",
    )
    assert len(snapshot["rates"]) == 5


def test_a_stack_that_is_down_is_a_page_naming_the_endpoint_not_a_traceback(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with running_console() as server:
        http = Http(server)
        http.sign_in()
        for path in ("/jobs", "/tasks", "/dlq", "/queues"):
            reply = http.request("GET", "/api" + path)
            assert reply.status == 502, (path, reply.text[:300])
            detail = reply.json()["detail"]
            assert dead in detail and "agentq local up" in detail, detail
            page = http.request("GET", path)
            assert page.status == 502 and dead in html.unescape(page.text)
    captured = capfd.readouterr()
    assert "Traceback" not in captured.out + captured.err


def test_the_printed_address_accepts_a_connection_before_the_server_runs(
    inproc_stack: Stack,
) -> None:
    # `agentq console` prints its URL, then starts uvicorn: a browser (or a test) that
    # opens it at once must wait for the page, not be refused.
    server = ConsoleServer.from_settings(Settings.from_env(), ConsoleOptions())
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
    finally:
        server.stop()
