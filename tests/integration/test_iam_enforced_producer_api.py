"""The producer API's handler signing as the producer-api role's user, with IAM enforced:
Powertools' resolver with API Gateway events carrying the caller's principal. A mapped
tenant submits, creates a job and adds to it, cancels, reads and lists; an admin
principal changes the shared definitions; a tenant's change is refused before any write."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from agentq.definitions import DefinitionsTable
from agentq.local.aws import local_session_clients
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.principals import PrincipalTenants
from lambdas import producer_api

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ACCOUNT: Final = "123456789012"
TENANT_ROLE: Final = f"arn:aws:iam::{ACCOUNT}:role/billing-runner"
ADMIN_ROLE: Final = f"arn:aws:iam::{ACCOUNT}:role/agentq-operators"


def _session(role: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role.rsplit('/', 1)[-1]}/run-1"


def _api(method: str, path: str, caller: str, body: Any = None) -> tuple[int, Any]:
    event = {
        "resource": path, "path": path, "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "pathParameters": None, "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT, "stage": "local", "requestId": str(uuid.uuid4()),
            "httpMethod": method, "resourcePath": path, "path": f"/local{path}",
            "identity": {"sourceIp": "127.0.0.1", "accountId": ACCOUNT, "userArn": caller},
        },
        "body": json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }  # fmt: skip
    response = producer_api.handler(event, None)
    return response["statusCode"], json.loads(response.get("body") or "null")


@pytest.fixture
def as_producer_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStack]:
    options = LocalStackOptions(stage="iamapi", workers=0, definitions_dirs=(SAMPLE_DEFINITIONS,),
                                health_interval_s=0, worker_env=fast_env(), work_dir=tmp_path,
                                iam=True)  # fmt: skip
    with LocalStack(options) as stack:
        assert stack.resources is not None and stack.moto is not None
        operator = local_session_clients(stack.moto.url)
        PrincipalTenants(operator["dynamodb"], stack.resources.table_name).map(
            TENANT_ROLE, "billing"
        )
        # This process now runs the Lambda: its environment, the producer-api role's key.
        for name, value in stack.credentials["producer-api"].env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("API_DEFINITION_ADMINS", ADMIN_ROLE)
        monkeypatch.setenv("API_TENANT_CACHE_SECONDS", "0")
        producer_api._client_for.cache_clear()
        producer_api._resolver_for.cache_clear()
        try:
            yield stack
        finally:
            producer_api._client_for.cache_clear()
            producer_api._resolver_for.cache_clear()


def test_iam_enforced_producer_api_role_serves_tenants_and_operators(
    as_producer_api: LocalStack,
) -> None:
    stack = as_producer_api
    assert stack.resources is not None and stack.moto is not None
    tenant, admin = _session(TENANT_ROLE), _session(ADMIN_ROLE)

    status, task = _api("POST", "/tasks", tenant, {"definition": "sample-echo", "input": {"v": 1}})
    assert status == 201 and task["tenant"] == "billing", task
    status, read = _api("GET", f"/tasks/{task['requestId']}", tenant)
    assert status == 200 and read["state"] == "PENDING", read
    # Its writes reach its tasks' and jobs' items (the role's writes are scoped to them).
    echo = {"definition": "sample-echo", "input": {}}
    status, job = _api("POST", "/jobs", tenant, {"job_id": "api-job", "tasks": {"A": echo}})
    assert status == 201 and job["tenant"] == "billing", job
    added = {"tasks": {"B": {**echo, "depends_on": ["A"]}}}
    assert _api("POST", "/jobs/api-job/tasks", tenant, added)[0] == 201
    status, cancelled = _api("POST", f"/tasks/{task['requestId']}/cancel", tenant)
    assert status == 200 and cancelled["state"] == "CANCELLED", cancelled
    assert _api("GET", "/task-definitions", tenant)[0] == 200  # a Scan of the table
    # A continuation reads its source's STATE item (a task's partition) under the role.
    follow_up = {"definition": "sample-echo", "continues": "r-none", "prompt": "And then?"}
    status, refused = _api("POST", "/tasks", tenant, follow_up)
    assert status == 400 and "task r-none was not found" in refused["message"], refused
    # The role may not read tenant settings: a continuation's check and the conversation
    # view go on without them (the worker's mark on a task stands for the setting).
    status, conversation = _api("GET", f"/tasks/{task['requestId']}/conversation", tenant)
    assert status == 200 and conversation["turns"] == [], conversation

    definition = {"kind": "python", "settings": {"callable": "agentq.samples.echo:run"}}
    assert _api("PUT", "/task-definitions/ops-echo", tenant, definition)[0] == 403
    status, stored = _api("PUT", "/task-definitions/ops-echo", admin, definition)
    assert status == 200, stored
    operator = local_session_clients(stack.moto.url)
    table = DefinitionsTable(operator["dynamodb"], stack.resources.definitions_table)
    assert table.get("ops-echo") is not None
    listed = _api("GET", "/task-definitions", tenant)[1]["definitions"]
    assert [d["name"] for d in listed] == ["ops-echo"]
    assert _api("DELETE", "/task-definitions/ops-echo", tenant)[0] == 403
    assert _api("DELETE", "/task-definitions/ops-echo", admin)[0] == 200
    assert table.get("ops-echo") is None
