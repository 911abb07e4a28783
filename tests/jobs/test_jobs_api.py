"""The producer API handler with API Gateway REST proxy events against moto's server:
tenancy from the request context, 4xx with clear messages, OpenAPI served."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import Stack
from jobs_support import client_for, drain, eventbridge, finish
from openapi_spec_validator import validate
from support import settle_indexes

from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.envelope import TaskEnvelope
from agentq.jobs import result_key
from agentq.principals import PrincipalTenants
from agentq.states import TaskState
from agentq.store import TaskStore
from agentq.store.keys import checkpoint_key
from agentq.store.tenants import TenantLimitStore
from lambdas import dispatcher, producer_api

pytestmark = pytest.mark.timeout(120)

SPEC: dict[str, Any] = {
    "name": "api job",
    "tasks": {
        "A": {"definition": "noop"},
        "B": {"definition": "summarize", "input": {"a": "${tasks.A.result}"}},
    },
}


def call(
    method: str,
    path: str,
    body: Any = None,
    *,
    tenant: str | None = "acme",
    account: str | None = None,
    query: dict[str, str] | None = None,
    raw: str | None = None,
) -> tuple[int, Any]:
    """The handler's answer; `raw` is a body sent as is (what json.dumps would not write)."""
    context: dict[str, Any] = {
        "accountId": "123456789012",
        "stage": "prod",
        "requestId": str(uuid.uuid4()),
        "httpMethod": method,
        "resourcePath": path,
        "path": f"/prod{path}",
        "identity": {"sourceIp": "127.0.0.1"},
    }
    if tenant is not None:
        context["authorizer"] = {"tenant": tenant, "principalId": "user"}
    if account is not None:
        context["identity"].update(accountId=account, userArn=f"arn:aws:iam::{account}:user/alice")
    event = {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in (query or {}).items()} or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": context,
        "body": raw if raw is not None else json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }
    response = producer_api.handler(event, None)
    text = response.get("body") or "null"
    return response["statusCode"], json.loads(text)


def test_jobs_api_jobs_and_tasks_are_per_tenant(stack: Stack) -> None:
    client_for(stack)
    status, job = call("POST", "/jobs", {**SPEC, "job_id": "api-1"})
    assert status == 201, job
    assert (job["jobId"], job["tenant"], job["total"]) == ("api-1", "acme", 2)
    assert [m["taskKey"] for m in drain(stack)] == ["A"]

    status, seen = call("GET", "/jobs/api-1")
    assert status == 200
    assert {t["key"]: t["state"] for t in seen["tasks"]} == {"A": "PENDING", "B": "BLOCKED"}
    assert call("GET", "/tasks/api-1-A")[1]["state"] == "PENDING"
    settle_indexes(stack)  # jobs are listed through the byTenant index
    assert [j["jobId"] for j in call("GET", "/jobs", query={"limit": "5"})[1]["jobs"]] == ["api-1"]

    # Another tenant: nothing of acme's exists for it.
    status, body = call("GET", "/jobs/api-1", tenant="globex")
    assert status == 404 and "api-1" in body["message"]
    assert call("GET", "/tasks/api-1-A", tenant="globex")[0] == 404
    assert call("GET", "/jobs", tenant="globex")[1] == {"jobs": []}
    assert call("POST", "/jobs/api-1/tasks", {"tasks": {"X": {"definition": "noop"}}},
                tenant="globex")[0] == 404  # fmt: skip

    # IAM callers without an authorizer tenant act for their principal's mapped tenant
    # (tests/jobs/test_jobs_api_principals.py); unmapped, they are refused.
    assert call("GET", "/jobs", tenant=None, account="444455556666")[0] == 403
    PrincipalTenants(stack.dynamodb, stack.resources.table_name).map(
        "arn:aws:iam::111122223333:user/alice", "alice-co"
    )
    status, mine = call("POST", "/tasks", {"definition": "noop", "idempotency_key": "k"},
                        tenant=None, account="111122223333")  # fmt: skip
    assert status == 201 and mine["tenant"] == "alice-co"
    again = call("POST", "/tasks", {"definition": "noop", "idempotency_key": "k"},
                 tenant=None, account="111122223333")[1]  # fmt: skip
    assert again["requestId"] == mine["requestId"]
    assert call("GET", f"/tasks/{mine['requestId']}")[0] == 404  # not acme's
    assert call("GET", "/jobs", tenant=None)[0] == 403


def test_jobs_api_adds_tasks_to_a_running_job(stack: Stack) -> None:
    client_for(stack)
    call("POST", "/jobs", {**SPEC, "job_id": "api-2"})
    drain(stack)
    dispatcher.handler(eventbridge(finish(stack, "api-2", "A", tenant="acme", result=7)), None)
    assert [m["taskKey"] for m in drain(stack)] == ["B"]
    status, job = call(
        "POST",
        "/jobs/api-2/tasks",
        {"tasks": {"C": {"definition": "noop", "input": {"a": "${tasks.A.result}"}}}},
    )
    assert status == 201 and job["total"] == 3
    [c] = drain(stack)  # its dependency had completed already: enqueued at once
    assert (c["taskKey"], c["input"]) == ("C", {"a": 7})
    status, body = call("POST", "/jobs/api-2/tasks", {"tasks": {"C": {"definition": "noop"}}})
    assert status == 400 and "duplicate task key" in body["message"]


def test_jobs_api_rejects_bad_input_with_clear_4xx(stack: Stack) -> None:
    client_for(stack)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"name": "x"}, 422, "body.tasks: Field required"),
        ({"tasks": {"a": {"definition": "noop"}}, "failure_policy": "sometimes"}, 422,
         "failure_policy"),
        ({"tasks": {"a": {"definition": "noop", "extra": 1}}}, 422, "extra"),
        ({"tasks": {"a": {"definition": "noop", "depends_on": ["b"]},
                    "b": {"definition": "noop", "depends_on": ["a"]}}}, 400,
         "dependency cycle: a → b → a"),
        ({"tasks": {"a": {"definition": "noop", "input": {"x": "${tasks.zz.result}"}}}}, 400,
         "${tasks.zz.result} names no task"),
        ({"tasks": {"a": {"definition": "no-such-definition"}}}, 400,
         "tasks.a.definition: unknown task definition"),
        # What DynamoDB would refuse on the job item is refused before it is written.
        ({"tasks": {"a": {"definition": "noop", "input": {"x": {"": 1}}}}}, 400,
         "tasks.a.input.x: has an empty key"),
        ({"tasks": {"a": {"definition": "noop", "input": {"x": 1e200}}}}, 400,
         "tasks.a.input.x: number"),
        ({"tasks": {"f": {"definition": "noop", "for_each": [{"": 1}],
                          "input": {"v": "${item}"}}}}, 400,
         "tasks.f_0.input.v: has an empty key"),
    ]  # fmt: skip
    for body, expected, words in cases:
        status, answer = call("POST", "/jobs", body)
        assert status == expected, (body, answer)
        assert words in answer["message"], (body, answer)
    assert call("GET", "/jobs")[1] == {"jobs": []}  # nothing was created
    assert drain(stack) == []
    assert call("GET", "/jobs", query={"limit": "0"})[0] == 422
    assert call("GET", "/tasks/not%20valid")[0] in (404, 422)
    assert call("GET", "/nowhere")[0] == 404


def test_jobs_api_task_definitions_crud(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # An operator (API_DEFINITION_ADMINS) changes definitions; a tenant reads them.
    monkeypatch.setenv("API_DEFINITION_ADMINS", "arn:aws:iam::123456789012:user/alice")
    admin: dict[str, Any] = {"tenant": None, "account": "123456789012"}
    status, stored = call("PUT", "/task-definitions/summarize",
                          {"kind": "agent", "timeout_s": 60, "description": "sum"}, **admin)  # fmt: skip
    assert status == 200 and stored["name"] == "summarize"
    assert call("GET", "/task-definitions/summarize")[1]["timeout_s"] == 60
    assert [d["name"] for d in call("GET", "/task-definitions")[1]["definitions"]] == ["summarize"]
    assert call("PUT", "/task-definitions/bad", {"kind": "shell"}, **admin)[0] == 422
    assert call("DELETE", "/task-definitions/summarize", **admin)[0] == 200
    assert call("GET", "/task-definitions/summarize")[0] == 404
    assert call("DELETE", "/task-definitions/summarize", **admin)[0] == 404


def test_jobs_api_serves_its_openapi_document(stack: Stack) -> None:
    status, document = call("GET", "/openapi.json")
    assert status == 200
    assert document["info"]["title"] == "agentq producer API"
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/tasks", "/tasks/{request_id}"} <= set(
        document["paths"]
    )
    assert "JobIn" in document["components"]["schemas"]
    # The resolver generates it from the routes: a valid OpenAPI document with every route.
    validate(document)
    routes = {
        "/jobs": {"get", "post"},
        "/jobs/{job_id}": {"get"},
        "/jobs/{job_id}/tasks": {"post"},
        "/tasks": {"post"},
        "/tasks/{request_id}": {"get"},
        "/tasks/{request_id}/cancel": {"post"},
        "/tasks/{request_id}/conversation": {"get"},
        "/task-definitions": {"get"},
        "/task-definitions/{name}": {"get", "put", "delete"},
    }
    assert {path: set(operations) for path, operations in document["paths"].items()} == routes


def test_jobs_api_delays_and_cancels_a_task(stack: Stack) -> None:
    client_for(stack)
    status, task = call("POST", "/tasks", {"definition": "noop", "delay": 600})
    assert status == 201 and task["state"] == "SCHEDULED" and task["notBefore"]
    status, at = call("POST", "/tasks", {"definition": "noop",
                                         "not_before": "2099-01-01T00:00:00Z"})  # fmt: skip
    assert status == 400 and at["field"] == "not_before"  # more than a year ahead
    both = {"definition": "noop", "delay": 5, "not_before": "2030-01-01T00:00:00Z"}
    assert call("POST", "/tasks", both)[0] == 400
    assert call("POST", "/tasks", {"definition": "noop", "delay": -1})[0] == 422
    # A tier this deployment lacks: a clear 400 naming the field, nothing sent.
    status, refused = call("POST", "/tasks", {"definition": "noop", "priority": "urgent"})
    assert status == 400 and refused["field"] == "priority", refused
    assert "unknown priority 'urgent'" in refused["message"]
    # Another tenant cannot cancel it; its own tenant can, once.
    assert call("POST", f"/tasks/{task['requestId']}/cancel", tenant="other")[0] == 404
    status, cancelled = call("POST", f"/tasks/{task['requestId']}/cancel", {"reason": "no"})
    assert status == 200 and cancelled["state"] == "CANCELLED"
    assert cancelled["cancelReason"] == "no"
    status, again = call("POST", f"/tasks/{task['requestId']}/cancel")
    assert status == 409 and again["state"] == "CANCELLED"


@pytest.mark.parametrize(
    ("path", "text", "words"),
    [
        (
            "/tasks",
            '{"definition": "noop", "input": ' + "[" * 5000 + "]" * 5000 + "}",
            "body: nested 5001 levels deep; the limit is 32",
        ),
        (
            "/tasks",
            '{"definition": "noop", "input": {"n": ' + "9" * 5000 + "}}",
            "body: not JSON: Exceeds the limit (4300 digits)",
        ),
        (
            "/jobs",
            '{"tasks": ' + '{"a": ' * 2000 + "1" + "}" * 2000 + "}",
            "body: nested 2001 levels deep",
        ),
    ],
    ids=["deep-task-input", "huge-integer", "deep-job-spec"],
)
def test_jobs_api_refuses_bodies_json_cannot_decode_with_a_400(
    stack: Stack, path: str, text: str, words: str
) -> None:
    # json.loads raises RecursionError or ValueError on these: a 502 from API Gateway.
    client_for(stack)
    status, answer = call("POST", path, raw=text)
    assert (status, answer["field"]) == (400, "body"), answer
    assert words in answer["message"]
    assert call("GET", "/jobs")[1] == {"jobs": []}
    assert drain(stack) == []


def test_jobs_api_refuses_a_spec_too_big_for_the_job_item(stack: Stack) -> None:
    client_for(stack)
    fan_out = {"definition": "noop", "for_each": ["p" * 900] * 500,
               "input": {"prompt": "${item}"}}  # fmt: skip
    status, answer = call("POST", "/jobs", {"job_id": "api-big", "tasks": {"f": fan_out}})
    assert status == 400, answer
    assert "400 KB" in answer["message"] and answer["field"] == "tasks"
    assert call("GET", "/jobs")[1] == {"jobs": []}  # nothing was created
    assert drain(stack) == []

    # Added tasks count with the job's own: the extended spec is what gets stored.
    call("POST", "/jobs", {"job_id": "api-grow", "tasks": {"a": {"definition": "noop"}}})
    drain(stack)
    status, answer = call("POST", "/jobs/api-grow/tasks", {"tasks": {"f": fan_out}})
    assert status == 400 and "400 KB" in answer["message"], answer
    assert call("GET", "/jobs/api-grow")[1]["total"] == 1
    assert drain(stack) == []


def test_jobs_api_refuses_definition_settings_dynamodb_cannot_store(stack: Stack) -> None:
    for settings, words in [
        ({"": 1}, "body.settings: Value error, has an empty key"),
        ({"model": {"x": 10**40}}, "body.settings: Value error, settings.model.x: number"),
    ]:
        status, answer = call("PUT", "/task-definitions/odd", {"kind": "agent",
                                                               "settings": settings})  # fmt: skip
        assert status == 422 and words in answer["message"], answer
    assert call("GET", "/task-definitions/odd")[0] == 404


def test_jobs_api_continues_a_finished_agent_task_of_the_callers_own(stack: Stack) -> None:
    client_for(stack)
    agent = {"prompt": "Note {text}", "output_schema": {"type": "object"}, "resume": True}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=agent)
    )
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    source = TaskEnvelope(request_id="src-1", tenant="acme", definition="notes")
    lease = store.acquire(source, worker_id="w", lease_seconds=60, max_attempts=3)
    bucket = stack.resources.bucket
    store.finalize(lease, TaskState.COMPLETED, fields={
        "result": {"bucket": bucket, "key": result_key("acme", "src-1", 1)},
        "checkpoint": {"bucket": bucket, "key": checkpoint_key("acme", "src-1", 1)},
    })  # fmt: skip
    follow_up = {"definition": "notes", "continues": "src-1", "prompt": "And then?"}

    status, task = call("POST", "/tasks", follow_up)
    assert status == 201, task
    assert task["requestId"] != "src-1" and task["state"] == "PENDING"
    # Another tenant naming the same id finds no such task of its own: nothing queued.
    status, refused = call("POST", "/tasks", follow_up, tenant="zeta")
    assert status == 400 and refused["field"] == "continues", refused
    assert "task src-1 was not found" in refused["message"]
    status, refused = call("POST", "/tasks", {**follow_up, "prompt": None})
    assert status == 400 and refused["field"] == "prompt"
    assert call("POST", "/tasks", {**follow_up, "continues": "not an id"})[0] == 422
    assert call("POST", "/tasks", {**follow_up, "prompt": ""})[0] == 422


def test_jobs_api_refuses_a_continuation_for_a_tenant_that_stores_no_transcripts(
    stack: Stack,
) -> None:
    """From the worker's mark on the source (what a producer API without a grant on
    tenant settings reads), and from the operator's setting (a job's continues edge)."""
    client_for(stack)
    agent = {"prompt": "Note {text}", "output_schema": {"type": "object"}, "resume": True}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=agent)
    )
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    lease = store.acquire(TaskEnvelope(request_id="src-2", tenant="acme", definition="notes"),
                          worker_id="w", lease_seconds=60, max_attempts=3)  # fmt: skip
    store.finalize(lease, TaskState.COMPLETED, fields={
        "result": {"bucket": stack.resources.bucket, "key": result_key("acme", "src-2", 1)},
        "transcripts": "off",
    })  # fmt: skip
    follow_up = {"definition": "notes", "continues": "src-2", "prompt": "And then?"}
    status, refused = call("POST", "/tasks", follow_up)
    assert status == 400 and refused["field"] == "continues", refused
    assert "tenant acme does not store transcripts" in refused["message"]

    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set_transcripts(
        "acme", stored=False
    )
    spec = {"tasks": {
        "draft": {"definition": "notes", "input": {"text": "x"}},
        "revise": {"definition": "notes", "continues": "draft", "prompt": "Shorter."},
    }, "job_id": "hushed"}  # fmt: skip
    status, refused = call("POST", "/jobs", spec)
    assert status == 400 and refused["field"] == "tasks.revise.continues", refused
    assert "does not store transcripts" in refused["message"]
    assert call("GET", "/jobs/hushed")[0] == 404  # nothing was created


def test_jobs_api_takes_a_tasks_own_resume_for_an_agent_task_only(stack: Stack) -> None:
    client_for(stack)
    agent = {"prompt": "Note {text}", "output_schema": {"type": "object"}}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=agent)
    )
    status, task = call("POST", "/tasks", {"definition": "notes", "input": {"text": "x"},
                                           "resume": True})  # fmt: skip
    assert status == 201, task
    assert task["resume"] is True
    assert call("GET", f"/tasks/{task['requestId']}")[1]["resume"] is True
    [sent] = drain(stack)
    assert sent["requestId"] == task["requestId"] and sent["resume"] is True
    status, plain = call("POST", "/tasks", {"definition": "notes", "input": {"text": "y"}})
    assert status == 201 and plain["resume"] is None
    assert "resume" not in drain(stack)[0]

    # JSON true or false only, and only for an agent definition: nothing is queued.
    for value in ("true", 1, "yes"):
        status, refused = call("POST", "/tasks", {"definition": "notes", "resume": value})
        assert status == 422 and "resume" in refused["message"], refused
    status, refused = call("POST", "/tasks", {"definition": "noop", "resume": False})
    assert status == 400 and refused["field"] == "resume", refused
    assert "'noop' is a python definition" in refused["message"]
    # A job spec's task field, refused the same way.
    spec = {"tasks": {"a": {"definition": "notes", "input": {"text": "z"}, "resume": True}},
            "job_id": "own"}  # fmt: skip
    status, job = call("POST", "/jobs", spec)
    assert status == 201, job
    [sent] = drain(stack)
    assert sent["taskKey"] == "a" and sent["resume"] is True
    status, refused = call("POST", "/jobs", {"tasks": {"a": {"definition": "noop",
                                                             "resume": True}}})  # fmt: skip
    assert status == 400 and refused["field"] == "tasks.a.resume", refused
    status, refused = call("POST", "/jobs", {"tasks": {"a": {"definition": "notes",
                                                             "resume": "on"}}})  # fmt: skip
    assert status == 422 and "resume" in refused["message"], refused
    assert drain(stack) == []
