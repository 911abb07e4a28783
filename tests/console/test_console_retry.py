"""Retrying one failed task of a job, from the console's job page, the client and the
CLI: only a FAILED or TIMEOUT task of that job, the job counting it again, once per
page however often the request is sent."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Stack
from console_support import Http, browser, define, running_console, signed_in
from playwright.sync_api import Browser

from agentq.client import AgentqClient
from agentq.envelope import TaskEnvelope
from agentq.jobs.retry import NotRetryable
from agentq.states import TaskState

__all__ = ["browser"]


def _end(client: AgentqClient, request_id: str, state: TaskState) -> None:
    """Run the task's attempt to `state` as a worker would (lock, then finalize)."""
    record = client.get_task(request_id)
    envelope = TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)
    lease = client.tasks.acquire(envelope, worker_id="w-test", lease_seconds=600,
                                 max_attempts=1)  # fmt: skip
    fields = {} if state is TaskState.COMPLETED else {
        "error": {"category": "network", "retryable": True, "message": "boom"}}  # fmt: skip
    client.tasks.finalize(lease, state, fields=fields)
    client.dispatcher.reconcile(record.tenant, str(record.job_id), trigger="test")


def _queued(stack: Stack) -> list[str]:
    # No long poll: the creation's messages are drained until none is left.
    got = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10,
                                    WaitTimeSeconds=0)  # fmt: skip
    return [json.loads(m["Body"])["requestId"] for m in got.get("Messages", [])]


@pytest.fixture
def failed_job(inproc_stack: Stack) -> AgentqClient:
    """Job `j` (policy continue): task a FAILED, b COMPLETED, so the job closed FAILED."""
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    client.create_job({"failure_policy": "continue",
                       "tasks": {"a": {"definition": "noop"}, "b": {"definition": "noop"}}},
                      job_id="j")  # fmt: skip
    _end(client, "j-a", TaskState.FAILED)
    _end(client, "j-b", TaskState.COMPLETED)
    job = client.get_job("j")
    assert (job.state, job.counts["failed"], job.counts["done"]) == ("FAILED", 1, 2)
    while _queued(inproc_stack):
        pass  # the creation's messages: what follows counts the retry's alone
    return client


@pytest.fixture
def http(failed_job: AgentqClient) -> Iterator[Http]:
    with running_console(allow_actions=True) as server:
        signed = Http(server)
        signed.sign_in()
        yield signed


def test_retry_from_the_job_page_reopens_the_job_once_however_often_sent(
    inproc_stack: Stack, failed_job: AgentqClient, http: Http
) -> None:
    client = failed_job
    body = {"jobId": "j", "key": "a", "nonce": http.nonce("/jobs/j")}
    # A double click, or the browser sending the POST again after a lost answer.
    first, second = (http.act("retry", body, csrf=http.csrf()) for _ in range(2))
    assert first.status == second.status == 200, (first.text, second.text)
    assert first.json() == second.json() == {"requestId": "j-a", "state": "PENDING",
                                             "jobState": "RUNNING"}  # fmt: skip
    task, job = client.get_task("j-a"), client.get_job("j")
    assert (task.state, task.attempt) == (TaskState.PENDING, 0)
    # Counted down once, not twice: the job's progress says one of two done.
    assert (job.state, job.counts["failed"], job.counts["done"]) == ("RUNNING", 0, 1)
    assert set(_queued(inproc_stack)) == {"j-a"}
    # Another page (another nonce) is another retry: refused, the task is not FAILED.
    again = http.act("retry", {**body, "nonce": http.nonce("/jobs/j")}, csrf=http.csrf())
    assert again.status == 409 and "PENDING" in again.json()["detail"]
    # On record, as every action: requested and done for each of the two requests.
    recorded = [e for e in client.events("j-a") if e["detailType"] == "Operator Action"]
    assert [e["payload"]["action"] for e in recorded] == ["retry"] * 6
    # The retried task completes: the job counts it and closes COMPLETED.
    _end(client, "j-a", TaskState.COMPLETED)
    job = client.get_job("j")
    assert (job.state, job.counts["completed"], job.counts["done"]) == ("COMPLETED", 2, 2)


def test_only_a_failed_task_of_that_job_is_retried(failed_job: AgentqClient, http: Http) -> None:
    nonce = http.nonce("/jobs/j")
    completed = http.act("retry", {"jobId": "j", "key": "b", "nonce": nonce}, csrf=http.csrf())
    assert completed.status == 409, completed.text
    assert failed_job.get_task("j-b").state is TaskState.COMPLETED
    missing = http.act("retry", {"jobId": "j", "key": "zz", "nonce": nonce}, csrf=http.csrf())
    assert missing.status == 404
    for bad in ({"jobId": "j", "key": "<b>", "nonce": nonce}, {"jobId": "j", "key": "a"},
                {"jobId": "../x", "key": "a", "nonce": nonce}):  # fmt: skip
        assert http.act("retry", bad, csrf=http.csrf()).status == 400, bad
    assert failed_job.get_task("j-a").state is TaskState.FAILED
    with pytest.raises(NotRetryable):
        failed_job.retry("j", "b")


def test_retry_needs_actions_on(failed_job: AgentqClient) -> None:
    with running_console(allow_actions=False) as server:
        http = Http(server)
        http.sign_in()
        body = {"jobId": "j", "key": "a", "nonce": http.nonce("/jobs/j")}
        assert http.act("retry", body, csrf=http.csrf()).status == 403
    assert failed_job.get_task("j-a").state is TaskState.FAILED


def test_a_retried_uncount_changes_the_job_once(failed_job: AgentqClient) -> None:
    # botocore sending the job's update again after it was applied.
    jobs = failed_job.jobs
    assert jobs.uncount("default", "j", "a", TaskState.FAILED) is not None
    assert jobs.uncount("default", "j", "a", TaskState.FAILED) is None
    assert failed_job.get_job("j").counts["done"] == 1


@pytest.mark.e2e
def test_chromium_retries_a_failed_task_from_the_job_page(
    failed_job: AgentqClient, browser: Browser
) -> None:
    with running_console(allow_actions=True) as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/jobs/j")
        page.wait_for_selector("#tasks tr[data-key='a'] .retry button")
        assert page.query_selector("#tasks tr[data-key='b'] .retry") is None
        page.click("#tasks tr[data-key='a'] .retry button")
        page.wait_for_selector("#tasks tr[data-key='a'] >> text=PENDING")
        assert failed_job.get_job("j").state == "RUNNING"


def test_the_cli_retries_a_task_and_lists_jobs_by_filter(
    failed_job: AgentqClient, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentq.cli import main

    assert main(["job", "list", "--state", "FAILED", "--search", "j", "--json"]) == 0
    assert [j["jobId"] for j in json.loads(capsys.readouterr().out)] == ["j"]
    assert main(["job", "list", "--definition", "nothing-runs-this", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["job", "list", "--since", "not a time"]) != 0
    capsys.readouterr()
    assert main(["job", "retry", "j", "a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"requestId": "j-a", "state": "PENDING",
                                                   "jobState": "RUNNING"}  # fmt: skip
    assert main(["job", "retry", "j", "a"]) != 0  # PENDING now: refused
    assert "only a FAILED or TIMEOUT task" in capsys.readouterr().err
