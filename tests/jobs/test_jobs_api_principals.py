"""The producer API's tenant from the caller's IAM principal: the real handler with API
Gateway REST proxy events, against moto, with mappings made the way an operator does
(`agentq tenants map`)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Final

import pytest
from conftest import Stack
from jobs_support import client_for

from agentq.cli import main as cli
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.errors import PrincipalNotMapped
from agentq.principals import PrincipalTenants, TenantResolver, parse_principal
from agentq.store.keys import checkpoint_key, state_key
from agentq.store.tenants import TenantLimitStore
from lambdas import producer_api

pytestmark = pytest.mark.timeout(120)

ACCOUNT: Final = "123456789012"
# Two principals of one account; the role has a path, API Gateway's userArn has none.
ROLE: Final = f"arn:aws:iam::{ACCOUNT}:role/service/billing-runner"
USER: Final = f"arn:aws:iam::{ACCOUNT}:user/people/alice"
OTHER_ROLE: Final = f"arn:aws:iam::{ACCOUNT}:role/not-mapped"
FIXTURES: Final = Path(__file__).resolve().parents[1] / "unit" / "fixtures"


def session(role_name: str, name: str = "ci-run-1") -> str:
    """What API Gateway reports for a caller using an assumed role's credentials."""
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role_name}/{name}"


def api(method: str, path: str, caller: str, body: Any = None) -> tuple[int, Any]:
    """The handler, called as API Gateway calls it for an IAM (SigV4) caller."""
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
            "accountId": ACCOUNT,
            "stage": "prod",
            "requestId": str(uuid.uuid4()),
            "httpMethod": method,
            "resourcePath": path,
            "path": f"/prod{path}",
            "identity": {"sourceIp": "127.0.0.1", "accountId": ACCOUNT, "userArn": caller},
        },
        "body": json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }
    response = producer_api.handler(event, None)
    return response["statusCode"], json.loads(response.get("body") or "null")


def mapped(stack: Stack) -> PrincipalTenants:
    store = PrincipalTenants(stack.dynamodb, stack.resources.table_name)
    store.map(ROLE, "billing")
    store.map(USER, "alice-team")
    return store


def test_two_principals_of_one_account_are_two_tenants(inproc_stack: Stack) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    billing, alice = session("billing-runner"), USER

    ids: dict[str, str] = {}
    for caller, tenant in ((billing, "billing"), (alice, "alice-team")):
        status, task = api("POST", "/tasks", caller, {"definition": "noop"})
        assert status == 201 and task["tenant"] == tenant, task
        ids[tenant] = task["requestId"]
        status, job = api("POST", "/jobs", caller,
                          {"tasks": {"a": {"definition": "noop"}}, "job_id": f"job-{tenant}"})  # fmt: skip
        assert status == 201 and job["tenant"] == tenant, job

    # Each sees its own, and only its own.
    assert api("GET", f"/tasks/{ids['billing']}", billing)[1]["tenant"] == "billing"
    assert api("GET", f"/tasks/{ids['alice-team']}", alice)[1]["tenant"] == "alice-team"
    assert [j["jobId"] for j in api("GET", "/jobs", billing)[1]["jobs"]] == ["job-billing"]
    assert [j["jobId"] for j in api("GET", "/jobs", alice)[1]["jobs"]] == ["job-alice-team"]

    # The other's ids answer exactly as ids that never existed: no existence leak.
    for caller, theirs in ((billing, ids["alice-team"]), (alice, ids["billing"])):
        status, body = api("GET", f"/tasks/{theirs}", caller)
        unknown_status, unknown = api("GET", "/tasks/never-submitted", caller)
        assert (status, unknown_status) == (404, 404)
        assert body == {"message": unknown["message"].replace("never-submitted", theirs)}
        assert api("POST", f"/tasks/{theirs}/cancel", caller)[0] == 404
    assert api("GET", "/jobs/job-alice-team", billing)[0] == 404
    assert api("POST", "/jobs/job-billing/tasks", alice,
               {"tasks": {"x": {"definition": "noop"}}})[0] == 404  # fmt: skip
    # ...and the cancel attempts changed nothing.
    assert api("GET", f"/tasks/{ids['billing']}", billing)[1]["state"] == "PENDING"


def test_a_tenant_reads_its_own_tasks_conversation_and_never_anothers(
    inproc_stack: Stack,
) -> None:
    """`GET /tasks/{id}/conversation` under the caller's tenant; another tenant's task
    answers as one that never existed, its checkpoint in S3 never read; a tenant whose
    transcripts are off is told so."""
    client_for(inproc_stack)
    mapped(inproc_stack)
    billing, alice = session("billing-runner"), USER
    DefinitionsTable(inproc_stack.dynamodb, inproc_stack.resources.definitions_table).put(
        TaskDefinition(name="chat", kind="agent", settings={
            "prompt": "{text}", "resume": True, "output_schema": {"type": "object"}})
    )  # fmt: skip
    task = api("POST", "/tasks", billing, {"definition": "chat", "input": {"text": "hi"}})[1]
    request_id = task["requestId"]
    inproc_stack.s3.put_object(
        Bucket=inproc_stack.resources.bucket, Key=checkpoint_key("billing", request_id, 1),
        Body=(FIXTURES / "resumed-attempt-1.jsonl").read_bytes(),
    )  # fmt: skip
    inproc_stack.dynamodb.update_item(
        TableName=inproc_stack.resources.table_name, Key=state_key("billing", request_id),
        UpdateExpression="SET attempt = :one", ExpressionAttributeValues={":one": {"N": "1"}},
    )  # fmt: skip

    status, conversation = api("GET", f"/tasks/{request_id}/conversation", billing)
    assert status == 200, conversation
    assert [t["kind"] for t in conversation["turns"]][:2] == ["prompt", "assistant"]
    assert conversation["turns"][1]["blocks"][0]["tool"] == "Bash"
    status, body = api("GET", f"/tasks/{request_id}/conversation", alice)
    assert status == 404 and "billing" not in json.dumps(body)
    assert "echo step-1" not in json.dumps(body)

    # The operator turns billing's transcripts off.
    TenantLimitStore(inproc_stack.dynamodb, inproc_stack.resources.table_name).set_transcripts(
        "billing", stored=False
    )
    status, conversation = api("GET", f"/tasks/{request_id}/conversation", billing)
    assert status == 200 and conversation["turns"] == []
    assert (
        conversation["note"] == "no conversation stored (tenant billing does not store transcripts)"
    )


def test_any_session_of_a_mapped_role_acts_for_its_tenant(inproc_stack: Stack) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    first = api("POST", "/tasks", session("billing-runner", "one"), {"definition": "noop"})[1]
    other = session("billing-runner", "another-session")
    assert api("GET", f"/tasks/{first['requestId']}", other)[1]["tenant"] == "billing"
    # The role ARN itself (a caller API Gateway names by role) maps the same way.
    assert api("GET", f"/tasks/{first['requestId']}", ROLE)[0] == 200
    # Same name under another account is another principal.
    stranger = "arn:aws:sts::210987654321:assumed-role/billing-runner/one"
    assert api("GET", f"/tasks/{first['requestId']}", stranger)[0] == 403


def test_an_unmapped_principal_is_refused_with_403(inproc_stack: Stack) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    for caller in (OTHER_ROLE, session("not-mapped"), f"arn:aws:iam::{ACCOUNT}:root", "junk"):
        for method, path, body in (("POST", "/tasks", {"definition": "noop"}),
                                   ("GET", "/jobs", None), ("GET", "/task-definitions", None)):  # fmt: skip
            status, answer = api(method, path, caller, body)
            assert status == 403, (caller, path, answer)
            assert "agentq tenants map" in answer["message"]
        # Changing a definition takes an operator, mapped or not.
        status, answer = api("PUT", "/task-definitions/noop", caller, {"kind": "python"})
        assert status == 403 and "operator-owned" in answer["message"], answer
    assert (
        "arn:aws:iam::123456789012:role/not-mapped is mapped to no tenant"
        in (api("GET", "/jobs", session("not-mapped"))[1]["message"])
    )
    assert (
        inproc_stack.sqs.receive_message(
            QueueUrl=inproc_stack.resources.queue_url, WaitTimeSeconds=0
        ).get("Messages", [])
        == []
    )


def test_the_account_fallback_is_a_setting(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    monkeypatch.setenv("API_ACCOUNT_TENANT", "true")
    status, task = api("POST", "/tasks", OTHER_ROLE, {"definition": "noop"})
    assert status == 201 and task["tenant"] == ACCOUNT
    # A mapping still wins over the fallback.
    assert api("POST", "/tasks", USER, {"definition": "noop"})[1]["tenant"] == "alice-team"


def test_an_unmapped_principal_is_refused_at_once_without_a_cache(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_for(inproc_stack)
    store = mapped(inproc_stack)
    monkeypatch.setenv("API_TENANT_CACHE_SECONDS", "0")
    assert api("GET", "/jobs", USER)[0] == 200
    assert store.unmap(USER) is not None
    assert api("GET", "/jobs", USER)[0] == 403
    store.map(USER, "alice-team")
    assert api("GET", "/jobs", USER)[0] == 200


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_revoked_mapping_stops_working_within_the_cache_bound(inproc_stack: Stack) -> None:
    store = mapped(inproc_stack)
    clock = Clock()
    resolver = TenantResolver(store, ttl_s=30, account_fallback=False, clock=clock)
    caller = session("billing-runner")
    assert resolver.tenant(caller, ACCOUNT) == "billing"
    store.unmap(ROLE)
    clock.now += 29.9  # within the bound the kept answer may still be used
    assert resolver.tenant(caller, ACCOUNT) == "billing"
    clock.now += 0.2  # past it, never
    with pytest.raises(PrincipalNotMapped):
        resolver.tenant(caller, ACCOUNT)
    # A new mapping works within the same bound (the refusal was kept as long).
    store.map(ROLE, "billing-2")
    clock.now += 30.1
    assert resolver.tenant(caller, ACCOUNT) == "billing-2"


def test_the_cache_holds_a_bounded_number_of_principals(inproc_stack: Stack) -> None:
    store = mapped(inproc_stack)
    clock = Clock()
    resolver = TenantResolver(store, ttl_s=30, account_fallback=False, clock=clock, max_entries=2)
    for name in ("a", "b", "c"):
        with pytest.raises(PrincipalNotMapped):
            resolver.tenant(session(name), ACCOUNT)
    assert resolver.tenant(session("billing-runner"), ACCOUNT) == "billing"
    assert len(resolver._cache) == 2
    assert parse_principal(ROLE).key in resolver._cache


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = cli([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_the_cli_maps_lists_and_unmaps(
    inproc_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    code, made = _cli(capsys, "tenants", "map", ROLE, "billing")
    assert code == 0 and made["key"] == f"arn:aws:iam::{ACCOUNT}:role/billing-runner"
    assert _cli(capsys, "tenants", "map", USER, "alice-team")[0] == 0
    code, listed = _cli(capsys, "tenants", "list")
    assert code == 0
    assert {(m["principal"], m["tenant"]) for m in listed} == {
        (ROLE, "billing"), (USER, "alice-team")
    }  # fmt: skip
    assert [m["tenant"] for m in _cli(capsys, "tenants", "list", "--tenant", "billing")[1]] == [
        "billing"
    ]
    # A remap replaces the tenant (one item per principal).
    assert _cli(capsys, "tenants", "map", ROLE, "billing-2")[0] == 0
    assert {m["tenant"] for m in _cli(capsys, "tenants", "list")[1]} == {"billing-2", "alice-team"}
    code, removed = _cli(capsys, "tenants", "unmap", ROLE)
    assert code == 0 and removed["unmapped"]["tenant"] == "billing-2"
    assert _cli(capsys, "tenants", "unmap", ROLE)[0] == 3  # not found
    # A session is not a principal to map; a tenant must be a tenant name.
    assert _cli(capsys, "tenants", "map", session("billing-runner"), "x")[0] == 6
    assert _cli(capsys, "tenants", "map", USER, "not a tenant")[0] == 6
    assert [m["tenant"] for m in _cli(capsys, "tenants", "list")[1]] == ["alice-team"]


def test_a_failed_tenant_lookup_answers_503(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    # A real DynamoDB error (ResourceNotFoundException) from the lookup's GetItem.
    monkeypatch.setenv("DYNAMODB_EVENTS_TABLE_NAME", "no-such-table")
    status, answer = api("GET", "/jobs", USER)
    assert (status, answer["message"]) == (503, "the tenant lookup failed; try again")
    monkeypatch.setenv("DYNAMODB_EVENTS_TABLE_NAME", inproc_stack.resources.table_name)
    assert api("GET", "/jobs", USER)[0] == 200


# -- task definitions: operator-owned ------------------------------------------------------
ADMIN_ROLE: Final = f"arn:aws:iam::{ACCOUNT}:role/ops/agentq-operators"
PYTHON_DEFINITION: Final = {"kind": "python", "settings": {"callable": "os:system"}}


def test_a_mapped_tenant_reads_definitions_and_cannot_change_them(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    monkeypatch.setenv("API_DEFINITION_ADMINS", ADMIN_ROLE)
    before = api("GET", "/task-definitions/noop", session("billing-runner"))
    assert before[0] == 200
    for caller in (session("billing-runner"), USER):
        status, body = api("PUT", "/task-definitions/noop", caller, PYTHON_DEFINITION)
        assert status == 403 and "operator-owned" in body["message"], body
        assert api("PUT", "/task-definitions/new-one", caller, PYTHON_DEFINITION)[0] == 403
        assert api("DELETE", "/task-definitions/noop", caller)[0] == 403
    # Nothing changed: the shared definition is still the operator's.
    assert api("GET", "/task-definitions/noop", USER) == before
    assert api("GET", "/task-definitions/new-one", USER)[0] == 404


def test_an_admin_principals_sessions_change_definitions_and_no_admin_means_nobody(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_for(inproc_stack)
    mapped(inproc_stack)
    admin_session = session("agentq-operators", "deploy-7")  # no tenant mapping needed
    body = {"kind": "python", "settings": {"callable": "agentq.samples.echo:run"}, "timeout_s": 30}
    monkeypatch.delenv("API_DEFINITION_ADMINS", raising=False)
    assert api("PUT", "/task-definitions/ops-echo", admin_session, body)[0] == 403
    monkeypatch.setenv("API_DEFINITION_ADMINS", f"{OTHER_ROLE},{ADMIN_ROLE}")
    status, stored = api("PUT", "/task-definitions/ops-echo", admin_session, body)
    assert status == 200 and stored["timeout_s"] == 30, stored
    assert api("GET", "/task-definitions/ops-echo", USER)[1]["timeout_s"] == 30
    assert api("DELETE", "/task-definitions/ops-echo", admin_session)[0] == 200
    assert api("GET", "/task-definitions/ops-echo", USER)[0] == 404
