"""Tenants are isolated in storage: the same request id from two tenants is two tasks.

Every producer path sends the same request id (or the same idempotency key, where the
id is derived per tenant) for two tenants; a real worker runs them all, the local Lambda
host stores their events. Each tenant then sees only its own input, result, logs and
events, through the client, the CLI and the producer API; the other tenant's reads of
an id it never used answer "not found". A message the worker rejects answers in
`agentq status` for the tenant it named, and only there.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

import pytest
from conftest import Stack
from support import wait_for
from worker_support import running_worker

from agentq.cli import main as cli
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.errors import NotFound
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import SAMPLE_DEFINITIONS
from agentq.states import TaskState
from lambdas import producer_api

pytestmark = pytest.mark.timeout(300)

TENANTS: Final = ("tenant-one", "tenant-two")
DEFINITION: Final = "sample-artifacts"
PATHS: Final = ("bus", "sqs", "job", "api", "cli")


def _input(tenant: str, path: str) -> dict[str, Any]:
    return {
        "echo": f"private output of {tenant} via {path}",
        "files": {"logs/summary.log": f"private log of {tenant} via {path}"},
    }


def _api(method: str, path: str, tenant: str, body: Any = None) -> tuple[int, Any]:
    """The producer API handler, called as API Gateway would with an authorizer tenant."""
    event = {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "accountId": "123456789012",
            "stage": "prod",
            "requestId": str(uuid.uuid4()),
            "httpMethod": method,
            "resourcePath": path,
            "path": f"/prod{path}",
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": {"tenant": tenant, "principalId": "user"},
        },
        "body": json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }
    response = producer_api.handler(event, None)
    return response["statusCode"], json.loads(response.get("body") or "null")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = cli(list(argv))
    # The local Lambda host's handlers print their metrics (EMF, one line each) to the
    # same stdout; the CLI's --json document is the indented one.
    lines = capsys.readouterr().out.splitlines()
    if "{" not in lines:
        return code, None
    start = lines.index("{")
    return code, json.loads("\n".join(lines[start : lines.index("}", start) + 1]))


def _submit_everywhere(
    stack: Stack, client: AgentqClient, capsys: pytest.CaptureFixture[str], tag: str
) -> dict[tuple[str, str], str]:
    """Every producer path, for both tenants; returns (path, tenant) → request id."""
    ids: dict[tuple[str, str], str] = {}
    for tenant in TENANTS:
        bus: dict[str, Any] = {"requestId": f"same-bus-{tag}", "tenant": tenant,
                               "definition": DEFINITION, "input": _input(tenant, "bus")}  # fmt: skip
        stack.events.put_events(
            Entries=[{"Source": "agentq", "DetailType": "Task Requested",
                      "Detail": json.dumps(bus), "EventBusName": stack.resources.bus_name}]
        )  # fmt: skip
        ids["bus", tenant] = bus["requestId"]
        raw = TaskEnvelope(request_id=f"same-sqs-{tag}", tenant=tenant, definition=DEFINITION,
                           input=_input(tenant, "sqs"))  # fmt: skip
        stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=raw.to_body(),
                               MessageAttributes=raw.message_attributes())  # fmt: skip
        ids["sqs", tenant] = raw.request_id
        job = client.create_job(
            {"tasks": {"a": {"definition": DEFINITION, "input": _input(tenant, "job")}}},
            job_id=f"same-job-{tag}", tenant=tenant,
        )  # fmt: skip
        ids["job", tenant] = f"{job.job_id}-a"
        status, task = _api("POST", "/tasks", tenant, {
            "definition": DEFINITION, "input": _input(tenant, "api"),
            "idempotency_key": f"same-api-{tag}"})  # fmt: skip
        assert status in (200, 201), task
        ids["api", tenant] = task["requestId"]
        code, submitted = _cli(capsys, "submit", DEFINITION, "--input",
                               json.dumps(_input(tenant, "cli")), "--idempotency-key",
                               f"same-cli-{tag}", "--tenant", tenant, "--json")  # fmt: skip
        assert code == 0, submitted
        ids["cli", tenant] = submitted["requestId"]
    return ids


def test_the_same_request_id_from_two_tenants_stays_two_private_tasks(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    client = AgentqClient.from_env()
    tag = uuid.uuid4().hex[:6]
    with (
        LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0),
        running_worker(stack, "tenants") as worker,
    ):
        ids = _submit_everywhere(stack, client, capsys, tag)
        for path in ("bus", "sqs", "job"):
            assert ids[path, TENANTS[0]] == ids[path, TENANTS[1]], "the same id, twice"
        # A message the worker rejects (no definition), naming tenant-one and an id.
        stack.sqs.send_message(
            QueueUrl=stack.resources.queue_url,
            MessageBody=json.dumps({"requestId": f"same-bad-{tag}", "tenant": TENANTS[0]}),
        )

        def all_done() -> bool:
            return all(
                (r := client.tasks.get(tenant, request_id)) is not None and r.state.terminal
                for (_, tenant), request_id in ids.items()
            )

        wait_for(all_done, timeout=180, message="every tenant's task finished")
        wait_for(
            lambda: all(
                any(e["detailType"] == "Task Completed" for e in client.events(rid, tenant=t))
                for (_, t), rid in ids.items()
            ),
            timeout=60,
            message="every terminal event stored",
        )  # fmt: skip
        rejected = wait_for(
            lambda: client.events(f"same-bad-{tag}", tenant=TENANTS[0]),
            timeout=60, message="the rejection's Task Failed stored",
        )  # fmt: skip
        worker.stop()
    assert rejected[-1]["detailType"] == "Task Failed"

    prefixes: set[str] = set()
    for (path, tenant), request_id in ids.items():
        own = _input(tenant, path)
        record = client.get_task(request_id, tenant=tenant)
        assert record.state is TaskState.COMPLETED, (path, tenant, record.raw.get("error"))
        assert record.tenant == tenant
        assert record.envelope is not None and record.envelope["input"] == own
        assert client.result(request_id, tenant=tenant) == {
            "files": ["logs/summary.log"], "echo": own["echo"]}  # fmt: skip
        files = client.artifacts(request_id, tenant=tenant)
        body = stack.s3.get_object(Bucket=stack.resources.bucket, Key=files["logs/summary.log"])
        assert body["Body"].read().decode() == own["files"]["logs/summary.log"]
        prefixes.add(record.raw["artifacts"]["prefix"])
        timeline = client.events(request_id, tenant=tenant)
        assert {e["tenant"] for e in timeline} == {tenant}
        assert [e["detailType"] for e in timeline].count("Task Completed") == 1
        # The CLI and the producer API read the same STATE item, keyed by the tenant.
        code, shown = _cli(capsys, "status", request_id, "--tenant", tenant, "--result",
                           "--json")  # fmt: skip
        assert code == 0 and shown["output"]["echo"] == own["echo"]
        status, seen = _api("GET", f"/tasks/{request_id}", tenant)
        assert status == 200 and seen["tenant"] == tenant
        assert seen["artifacts"]["prefix"] == record.raw["artifacts"]["prefix"]
    assert len(prefixes) == len(ids), "every task has its own folder"
    for path in ("api", "cli"):
        # Derived per tenant from the same key: the other tenant's id is not theirs to read.
        one, two = ids[path, TENANTS[0]], ids[path, TENANTS[1]]
        assert one != two
        with pytest.raises(NotFound):
            client.get_task(one, tenant=TENANTS[1])
        assert _api("GET", f"/tasks/{two}", TENANTS[0])[0] == 404

    # The rejected message: FAILED for the tenant it named, unknown to the other one.
    code, shown = _cli(capsys, "status", f"same-bad-{tag}", "--tenant", TENANTS[0], "--json")
    assert code != 0 and shown["state"] == "FAILED"
    assert shown["error"]["category"] in ("validation", "parse")
    code, _ = _cli(capsys, "status", f"same-bad-{tag}", "--tenant", TENANTS[1], "--json")
    assert code == 3  # not found
