"""What a refresh costs: a job page's AWS requests, counted and bounded, and the cache of
rows that can no longer change, which must never hide a change that can still happen."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Stack
from console_support import Http, define

from agentq.aws import AwsClients, CallCounter
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console import ConsoleOptions, ConsoleServer
from agentq.console.jobtasks import ROW_ATTRIBUTES
from agentq.console.server import build_parts
from agentq.states import TaskState
from bench.console import fill

FINAL = ("COMPLETED", "CANCELLED")


@dataclass
class Counted:
    http: Http
    counter: CallCounter
    batch_reads: list[dict[str, Any]]
    item_reads: list[dict[str, Any]]

    def get(self, path: str, **headers: str) -> tuple[int, Any, dict[str, int]]:
        """One refresh: its status, its JSON (None for a 304) and its AWS requests."""
        before = self.counter.snapshot()
        reply = self.http.request("GET", path, headers=headers)
        after = self.counter.snapshot()
        calls = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
        return reply.status, reply.json() if reply.status == 200 else reply.headers, calls


@pytest.fixture
def counted(stack: Stack) -> Iterator[Counted]:
    settings = Settings.from_env()
    counter = CallCounter()
    aws = AwsClients(settings.region, counter=counter)
    batch_reads: list[dict[str, Any]] = []
    item_reads: list[dict[str, Any]] = []
    events = aws.dynamodb.meta.events
    events.register("provide-client-params.dynamodb.BatchGetItem",
                    lambda params, **_: batch_reads.append(params))  # fmt: skip
    events.register("provide-client-params.dynamodb.GetItem",
                    lambda params, **_: item_reads.append(params))  # fmt: skip
    with ConsoleServer(build_parts(settings, aws, ConsoleOptions())) as server:
        http = Http(server)
        http.sign_in()
        yield Counted(http, counter, batch_reads, item_reads)


def test_a_job_page_refresh_reads_only_the_tasks_that_can_still_change(
    stack: Stack, counted: Counted
) -> None:
    settings = Settings.from_env()
    job_id = fill(settings, stack.dynamodb, tasks=150, jobs=0)
    path = f"/api/jobs/{job_id}"

    status, first, calls = counted.get(path)
    assert status == 200 and len(first["tasks"]) == 150
    # Cold: the job, every task in batches of 100, the job's events.
    assert calls == {"dynamodb:GetItem": 1, "dynamodb:BatchGetItem": 2, "dynamodb:Query": 1}
    # Only the attributes a row is made of: never the envelope (the task's input).
    for params in counted.batch_reads:
        [(_, request)] = params["RequestItems"].items()
        assert request["ConsistentRead"] is True
        assert sorted(request["ExpressionAttributeNames"].values()) == sorted(ROW_ATTRIBUTES)
        assert "envelope" not in str(request)

    live = [t for t in first["tasks"] if t["state"] not in FINAL]
    assert 0 < len(live) <= 100  # so a warm refresh is one batch less
    tag = counted.http.request("GET", path).headers["etag"]
    status, _, calls = counted.get(path, **{"If-None-Match": tag})
    assert status == 304
    # Warm: the COMPLETED and CANCELLED rows are kept; the others are read again.
    bound = 2 + math.ceil(len(live) / 100)
    assert calls == {"dynamodb:GetItem": 1, "dynamodb:BatchGetItem": bound - 2,
                     "dynamodb:Query": 1}  # fmt: skip

    # What can still change does show: a FAILED task redriven goes back to PENDING
    # (FAILED is not kept for that reason), a PENDING one is cancelled.
    client = AgentqClient.from_env()
    failed = next(t for t in first["tasks"] if t["state"] == "FAILED")
    pending = next(t for t in first["tasks"] if t["state"] == "PENDING")
    assert client.tasks.reset_for_redrive(settings.tenant_id, failed["requestId"]) is not None
    client.tasks.transition(settings.tenant_id, pending["requestId"],
                            from_states=[TaskState.PENDING], to_state=TaskState.CANCELLED)  # fmt: skip
    status, after, _ = counted.get(path, **{"If-None-Match": tag})
    assert status == 200
    states = {t["key"]: t["state"] for t in after["tasks"]}
    assert (states[failed["key"]], states[pending["key"]]) == ("PENDING", "CANCELLED")
    assert [t for t in after["tasks"] if t["key"] not in (failed["key"], pending["key"])] == [
        t for t in first["tasks"] if t["key"] not in (failed["key"], pending["key"])
    ]

    # The job's spec is read once: a refresh asks only for the job's progress...
    reads = counted.item_reads
    assert reads[0].get("ProjectionExpression") is None
    assert all("spec" not in str(r["ExpressionAttributeNames"]) for r in reads[1:])
    # ...until tasks are added to it (its total moves), then the whole item again.
    define(stack, "noop")
    client.add_tasks(job_id, {"late": {"definition": "noop"}})
    del reads[:]
    _, grown, calls = counted.get(path)
    assert "late" in {t["key"] for t in grown["tasks"]} and len(grown["tasks"]) == 151
    assert calls["dynamodb:GetItem"] == 2 and reads[-1].get("ProjectionExpression") is None


def test_a_finished_jobs_refresh_reads_no_task(stack: Stack, counted: Counted) -> None:
    define(stack, "noop")
    client = AgentqClient.from_env()
    spec = {"tasks": {"a": {"definition": "noop"}, "b": {"definition": "noop"}}}
    job = client.create_job(spec, job_id="all-cancelled")
    client.cancel(job_id=job.job_id)
    _, first, calls = counted.get("/api/jobs/all-cancelled")
    assert [t["state"] for t in first["tasks"]] == ["CANCELLED", "CANCELLED"]
    assert calls["dynamodb:BatchGetItem"] == 1
    _, again, calls = counted.get("/api/jobs/all-cancelled")
    assert again == first
    assert calls == {"dynamodb:GetItem": 1, "dynamodb:Query": 1}


def test_the_front_end_is_cached_by_the_browser_and_data_never_is(counted: Counted) -> None:
    page = counted.http.request("GET", "/jobs")
    scripts = re.findall(r'src="(/static/[a-z]+\.js\?v=[0-9a-f]+)"', page.text)
    assert len(scripts) == 5
    for url in scripts:
        reply = counted.http.request("GET", url)
        assert reply.status == 200
        assert reply.headers["cache-control"] == "private, max-age=31536000, immutable"
    # Unversioned, or anything else: asked again every time.
    assert counted.http.request("GET", "/static/main.js").headers["cache-control"] == "no-store"
    assert page.headers["cache-control"] == "no-store"
    assert counted.http.request("GET", "/api/jobs").headers["cache-control"] == "no-store"
