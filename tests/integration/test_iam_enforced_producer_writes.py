"""A producer's writes with IAM enforced, signing as the `ProducerPolicy` user: submit,
job create and add, cancel, a job task's retry and the console's resubmit write their
tasks' and jobs' items without a denial, while a tenant's limit, its seats and a
principal's tenant mapping (operator-owned items) are denied to it, through the CLI
and by direct calls."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import boto3
import pytest
from botocore.exceptions import ClientError
from cli_support import Ran, agentq
from support import wait_for

from agentq.aws import AwsClients
from agentq.config import Settings
from agentq.console.server import ConsoleOptions, build_parts
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.jobs import task_request_id
from agentq.local.aws import LOCAL_REGION, local_session_clients
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.principals import PrincipalTenants, mappable_principal, principal_pk
from agentq.states import TaskState
from agentq.store import TaskStore
from agentq.store import keys as store_keys
from agentq.store.tenants import LIMITS_SK, TenantLimitStore, seat_sk, tenant_pk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DENIED: Final = "not authorized to perform"
TENANT: Final = "acme"
OWN_ROLE: Final = "arn:aws:iam::123456789012:role/acme-producer"
SERVICES: Final = ("s3", "sqs", "dynamodb", "events", "sts")


@pytest.fixture
def as_producer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A stack with IAM enforced and no worker (tasks stay where the test puts them);
    this process signs as its producer. Yields the stack, an AgentqClient over watched
    clients and the denials those clients met."""
    options = LocalStackOptions(stage="iamprod", workers=0, definitions_dirs=(SAMPLE_DEFINITIONS,),
                                health_interval_s=0, worker_env=fast_env(), work_dir=tmp_path,
                                iam=True)  # fmt: skip
    with LocalStack(options) as stack:
        for name, value in stack.env().items():
            monkeypatch.setenv(name, value)
        assert os.environ["AWS_ACCESS_KEY_ID"] == stack.credentials["producer"].access_key_id
        denials: list[str] = []

        def record(http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
            error = parsed.get("Error") or {}
            if http_response.status_code == 403 or "AccessDenied" in str(error.get("Code", "")):
                denials.append(f"{model.name}: {http_response.content.decode(errors='replace')}")

        settings = Settings.from_env()
        aws = AwsClients(settings.region)
        for service in SERVICES:
            aws.get(service).meta.events.register("after-call", record)
        # The console's parts as a producer's key would drive them: its resubmit is a
        # producer's submit.
        yield stack, build_parts(settings, aws, ConsoleOptions(allow_actions=True)), denials


def _cli(stack: LocalStack, *args: str) -> Ran:
    return agentq({**os.environ, **stack.env()}, *args)


def _ok(done: Ran) -> Any:
    assert done.code == 0, done.stderr[-2000:]
    assert DENIED not in done.stderr
    return json.loads(done.stdout) if done.stdout.lstrip().startswith(("{", "[")) else None


def _denied_cli(stack: LocalStack, operation: str, *args: str) -> None:
    done = _cli(stack, *args)
    assert done.code != 0, done.stdout[-2000:]
    assert f" in {operation}:" in done.stderr and "AccessDenied" in done.stderr, done.stderr[-2000:]


def _failed_job_task(stack: LocalStack, client: Any, job_id: str) -> None:
    """The job's task A dead-lettered after its only attempt: the dlq-processor (with
    its own key) closes it FAILED."""
    assert stack.resources is not None and stack.moto is not None
    client.create_job({"tasks": {"A": {"definition": "sample-echo", "input": {}}}},
                      job_id=job_id, tenant=TENANT)  # fmt: skip
    record = client.get_task(task_request_id(job_id, "A"), tenant=TENANT)
    envelope = TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)
    admin = local_session_clients(stack.moto.url)
    tasks = TaskStore(admin["dynamodb"], stack.resources.table_name)
    spent = tasks.acquire(envelope, worker_id="w-gone", lease_seconds=0.05, max_attempts=1)
    wait_for(lambda: now_ms() > spent.effective_until_ms, timeout=5, message="lease lapse")
    admin["sqs"].send_message(QueueUrl=stack.resources.dlq_url, MessageBody=envelope.to_body(),
                              MessageAttributes=envelope.message_attributes())  # fmt: skip
    wait_for(lambda: (r := tasks.get(TENANT, envelope.request_id)) and r.state is TaskState.FAILED,
             timeout=60, message="the job task closed out FAILED")  # fmt: skip


def test_iam_enforced_producer_writes_tasks_and_jobs_but_no_tenant_settings(
    as_producer: Any,
) -> None:
    stack, parts, denials = as_producer
    assert stack.resources is not None and stack.moto is not None
    client = parts.actions._client
    table = stack.resources.table_name
    tasks = TaskStore(local_session_clients(stack.moto.url)["dynamodb"], table)

    # Submit (a retried one with the same idempotency key is the same task).
    first = client.submit("sample-echo", {"v": 1}, tenant=TENANT, idempotency_key="k-1")
    again = client.submit("sample-echo", {"v": 1}, tenant=TENANT, idempotency_key="k-1")
    assert again.request_id == first.request_id
    # A job created, a task added to it, then the job cancelled from the CLI.
    client.create_job({"tasks": {"A": {"definition": "sample-echo", "input": {}}}},
                      job_id="pjob", tenant=TENANT)  # fmt: skip
    client.add_tasks("pjob", {"B": {"definition": "sample-echo", "input": {}, "depends_on": ["A"]}},
                     tenant=TENANT)  # fmt: skip
    _ok(_cli(stack, "job", "cancel", "pjob", "--tenant", TENANT, "--json"))
    assert tasks.require(TENANT, task_request_id("pjob", "A")).state is TaskState.CANCELLED
    # Cancels: the client's and `agentq cancel`.
    assert client.cancel(first.request_id, tenant=TENANT)[0].outcome == "cancelled"
    other = client.submit("sample-echo", {"v": 2}, tenant=TENANT)
    _ok(_cli(stack, "cancel", other.request_id, "--tenant", TENANT, "--json"))
    assert tasks.require(TENANT, other.request_id).state is TaskState.CANCELLED
    # The console's resubmit (as a producer's key would make it) and a job task's retry.
    resubmitted = parts.actions.resubmit(TENANT, first.request_id, "r" * 16)["requestId"]
    assert tasks.require(TENANT, resubmitted).state is TaskState.PENDING
    _failed_job_task(stack, client, "pjobf")
    retried = _ok(_cli(stack, "job", "retry", "pjobf", "A", "--tenant", TENANT, "--json"))
    assert retried["state"] == TaskState.PENDING.value
    assert denials == []

    # Operator-owned items: a tenant's limit and a principal's mapping, by the CLI...
    _denied_cli(stack, "PutItem", "tenants", "limit", TENANT, "50", "--json")
    _denied_cli(stack, "PutItem", "tenants", "map", OWN_ROLE, "other-tenant", "--json")
    # ... and by direct calls: no put of a mapping or an override, no seat taken or
    # held, alone or inside a transaction with a task's own item.
    producer = stack.credentials["producer"]
    dynamodb = boto3.client("dynamodb", endpoint_url=stack.moto.url, region_name=LOCAL_REGION,
                            aws_access_key_id=producer.access_key_id,
                            aws_secret_access_key=producer.secret_access_key)  # fmt: skip
    mapping = {"PK": {"S": principal_pk(mappable_principal(OWN_ROLE))}, "SK": {"S": "TENANT"},
               "tenant": {"S": "other-tenant"}, "principal": {"S": OWN_ROLE}}  # fmt: skip
    with pytest.raises(ClientError, match=f"{DENIED}: dynamodb:PutItem"):
        dynamodb.put_item(TableName=table, Item=mapping)
    seat = {"PK": {"S": tenant_pk(TENANT)}, "SK": {"S": seat_sk(0)}}
    hold = {"TableName": table, "Key": seat, "UpdateExpression": "SET leaseUntil = :far",
            "ExpressionAttributeValues": {":far": {"N": str(now_ms() + 86_400_000)}}}  # fmt: skip
    with pytest.raises(ClientError, match=f"{DENIED}: dynamodb:UpdateItem"):
        dynamodb.update_item(**hold)
    own_task = {"TableName": table, "Key": store_keys.state_key(TENANT, other.request_id),
                "UpdateExpression": "SET note = :n", "ExpressionAttributeValues": {":n": {"S": "x"}}}  # fmt: skip
    with pytest.raises(ClientError, match="AccessDenied"):
        dynamodb.transact_write_items(TransactItems=[{"Update": own_task}, {"Update": hold}])
    dynamodb.update_item(**own_task)  # its own task's item alone is a producer's write
    # Nor may it read them: another principal's mapping, a tenant's limit or its seats.
    for key in (mapping, seat, {"PK": {"S": tenant_pk(TENANT)}, "SK": {"S": LIMITS_SK}}):
        with pytest.raises(ClientError, match=f"{DENIED}: dynamodb:GetItem"):
            dynamodb.get_item(TableName=table, Key={"PK": key["PK"], "SK": key["SK"]})
    with pytest.raises(ClientError, match=f"{DENIED}: dynamodb:Query"):
        dynamodb.query(TableName=table, KeyConditionExpression="PK = :pk",
                       ExpressionAttributeValues={":pk": {"S": tenant_pk(TENANT)}})  # fmt: skip
    assert "Item" in dynamodb.get_item(TableName=table, Key=own_task["Key"])

    admin = local_session_clients(stack.moto.url)["dynamodb"]
    assert PrincipalTenants(admin, table).all() == []
    assert TenantLimitStore(admin, table).get(TENANT) is None
    assert TenantLimitStore(admin, table).seats(TENANT) == []
