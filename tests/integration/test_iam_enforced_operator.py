"""The operator's commands with IAM enforced, signing as the `OperatorPolicy` user: dead
letters listed, redriven and discarded, tenant limits and mappings set and removed,
stats read, tasks cancelled and job tasks retried, through the CLI and the console's
own parts. Then each statement the operator holds beyond a producer's is taken away in
turn, and the command that needs it is denied."""

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
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console.server import ConsoleOptions, build_parts
from agentq.dlq import ArchivedMessage, DlqArchive, archive_key
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.jobs import task_request_id
from agentq.local.aws import LOCAL_REGION, local_session_clients
from agentq.local.iam import synthesized_policies
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.states import TaskState
from agentq.stats import StatsReader
from agentq.store import TaskStore
from agentq.store import keys as store_keys
from agentq.store.workers import WorkerRoster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DENIED: Final = "not authorized to perform"
TENANT: Final = "acme"
MAPPED_ROLE: Final = "arn:aws:iam::123456789012:role/ci-producer"
# The clients the console's parts and `agentq stats` use.
SERVICES: Final = ("s3", "sqs", "dynamodb", "events", "cloudwatch", "sts")


def _stack(tmp_path: Path, stage: str, without: tuple[str, ...] = ()) -> LocalStack:
    # No worker: every task stays where the test puts it.
    return LocalStack(LocalStackOptions(
        stage=stage, workers=0, definitions_dirs=(SAMPLE_DEFINITIONS,), health_interval_s=0,
        worker_env=fast_env(), work_dir=tmp_path, iam=True,
        iam_without={"operator": without} if without else {},
    ))  # fmt: skip


def _cli(stack: LocalStack, *args: str) -> Ran:
    return agentq({**os.environ, **stack.operator_env()}, *args)


def _ok(done: Ran) -> Any:
    assert done.code == 0, done.stderr[-2000:]
    assert DENIED not in done.stderr
    return json.loads(done.stdout) if done.stdout.lstrip().startswith(("{", "[")) else None


class Denials:
    """Every AccessDenied the operator's in-process clients meet, those the console
    shows as a missing figure (a queue's age) included."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def watch(self, aws: AwsClients) -> AwsClients:
        for service in SERVICES:
            aws.get(service).meta.events.register("after-call", self._record)
        return aws

    def _record(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        # By status and body: moto answers a denial in XML whatever the service's
        # protocol, so a JSON or CBOR client may parse no AccessDenied code from it.
        # (A success's body is not touched: it may be a stream the caller reads.)
        error = parsed.get("Error") or {}
        if http_response.status_code == 403 or "AccessDenied" in str(error.get("Code", "")):
            body = http_response.content.decode(errors="replace")
            self.seen.append(f"{model.name}: {error.get('Message') or body}")


@pytest.fixture
def as_operator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Points this process's AWS clients at the stack as its operator; returns the
    console's parts, a stats reader as on AWS (with CloudWatch), and the denials seen."""

    def start(stack: LocalStack) -> tuple[Any, StatsReader, Denials]:
        for name, value in stack.operator_env().items():
            monkeypatch.setenv(name, value)
        settings = Settings.from_env()
        denials = Denials()
        aws = denials.watch(AwsClients(settings.region))
        parts = build_parts(settings, aws, ConsoleOptions(allow_actions=True))
        # `agentq stats` reads the queues' ages from CloudWatch off the local stack only.
        stats = StatsReader(settings.model_copy(update={"local": False}), sqs=aws.sqs,
                            dynamodb=aws.dynamodb, cloudwatch=aws.get("cloudwatch"))  # fmt: skip
        return parts, stats, denials

    yield start


def _admin(stack: LocalStack) -> dict[str, Any]:
    assert stack.moto is not None
    return local_session_clients(stack.moto.url)


def _dead_letter(stack: LocalStack, envelope: TaskEnvelope) -> None:
    """The task's only attempt spent by a holder that died, its message dead-lettered:
    the dlq-processor (with its own key) closes it FAILED and archives the letter."""
    assert stack.resources is not None
    admin = _admin(stack)
    tasks = TaskStore(admin["dynamodb"], stack.resources.table_name)
    if tasks.get(envelope.tenant, envelope.request_id) is None:
        tasks.create(envelope)
    spent = tasks.acquire(envelope, worker_id="w-gone", lease_seconds=0.05, max_attempts=1)
    wait_for(lambda: now_ms() > spent.effective_until_ms, timeout=5, message="lease lapse")
    admin["sqs"].send_message(QueueUrl=stack.resources.dlq_url, MessageBody=envelope.to_body(),
                              MessageAttributes=envelope.message_attributes())  # fmt: skip


def _failed(stack: LocalStack, tenant: str, request_id: str) -> None:
    assert stack.resources is not None
    tasks = TaskStore(_admin(stack)["dynamodb"], stack.resources.table_name)
    wait_for(lambda: (r := tasks.get(tenant, request_id)) and r.state is TaskState.FAILED,
             timeout=60, message=f"{request_id} closed out FAILED")  # fmt: skip


def _archived(stack: LocalStack, *request_ids: str) -> dict[str, str]:
    """request id -> archive key, once every one is archived."""
    assert stack.resources is not None
    archive = DlqArchive(_admin(stack)["s3"], stack.resources.bucket)

    def keys() -> dict[str, str] | None:
        found = {m.request_id: m.key for m in archive.list() if m.request_id}
        return found if set(request_ids) <= set(found) else None

    found = wait_for(keys, timeout=60, message="the dead letters archived")
    return {rid: found[rid] for rid in request_ids}


def _job_task(stack: LocalStack, client: AgentqClient, job_id: str) -> TaskEnvelope:
    client.create_job({"tasks": {"A": {"definition": "sample-echo", "input": {}}}}, job_id=job_id)
    record = client.get_task(task_request_id(job_id, "A"))
    return TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)


def _standalone(request_id: str) -> TaskEnvelope:
    return TaskEnvelope(request_id=request_id, tenant=TENANT, definition="sample-echo", input={})


def test_iam_enforced_operator_runs_every_operator_command(
    tmp_path: Path, as_operator: Any
) -> None:
    with _stack(tmp_path, "iamop") as stack:
        assert stack.resources is not None
        operator = stack.credentials["operator"]
        assert stack.operator_env()["AWS_ACCESS_KEY_ID"] == operator.access_key_id
        parts, stats, denials = as_operator(stack)
        client = parts.actions._client  # the console's AgentqClient, signing as the operator

        # Dead letters: three standalone tasks and two job tasks, closed out and archived
        # by the dlq-processor.
        jobs = [_job_task(stack, client, job) for job in ("opjob1", "opjob2")]
        letters = [_standalone(rid) for rid in ("op-cli", "op-console", "op-discard")]
        for envelope in [*letters, *jobs]:
            _dead_letter(stack, envelope)
        keys = _archived(stack, *(e.request_id for e in [*letters, *jobs]))
        for envelope in jobs:
            _failed(stack, envelope.tenant, envelope.request_id)

        # `agentq dlq list --peek` and `agentq dlq redrive`.
        listed = _ok(_cli(stack, "dlq", "list", "--peek", "--json"))
        assert {"op-cli", "op-console", "op-discard"} <= {
            m["request_id"] for m in listed["archived"]
        }
        redriven = _ok(_cli(stack, "dlq", "redrive", "op-cli", "--json"))
        assert [r["outcome"] for r in redriven["results"]] == ["redriven"]
        tasks = TaskStore(_admin(stack)["dynamodb"], stack.resources.table_name)
        assert tasks.require(TENANT, "op-cli").state is TaskState.PENDING

        # The console: its pages' reads, then a redrive and a discard.
        assert {row["requestId"] for row in parts.dead_letters.list()["letters"]} >= {
            "op-console", "op-discard"
        }  # fmt: skip
        snapshot = parts.operations.snapshot()
        assert [q["name"] for q in snapshot["queues"]][-1] == "dead letters"
        answer = parts.actions.redrive([keys["op-console"]])
        assert [r["outcome"] for r in answer["results"]] == ["redriven"]
        assert parts.actions.discard([keys["op-discard"]])["results"][0]["outcome"] == "discarded"
        remaining = {m.key for m in DlqArchive(_admin(stack)["s3"], stack.resources.bucket).list()}
        assert keys["op-discard"] not in remaining and keys["op-console"] in remaining

        # A job's failed task retried, from the CLI and from the console.
        retried = _ok(_cli(stack, "job", "retry", "opjob1", "A", "--tenant", jobs[0].tenant,
                           "--json"))  # fmt: skip
        assert retried["state"] == TaskState.PENDING.value
        again = parts.actions.retry(jobs[1].tenant, "opjob2", "A", "n" * 16)
        assert again["state"] == TaskState.PENDING.value

        # Cancels: `agentq cancel` and the console's.
        for via_console in (False, True):
            submitted = client.submit("sample-echo", {}, tenant=TENANT)
            if via_console:
                answer = parts.actions.cancel(TENANT, request_id=submitted.request_id)
                assert answer["outcome"] == "cancelled"
            else:
                _ok(_cli(stack, "cancel", submitted.request_id, "--tenant", TENANT, "--json"))
            assert tasks.require(TENANT, submitted.request_id).state is TaskState.CANCELLED

        # Tenant limits and mappings set, shown and removed.
        _ok(_cli(stack, "tenants", "limit", TENANT, "3", "--json"))
        shown = _ok(_cli(stack, "tenants", "show", TENANT, "--json"))
        assert shown["tenants"][0]["limit"] == 3 and shown["tenants"][0]["override"]
        _ok(_cli(stack, "tenants", "limit", TENANT, "default", "--json"))
        shown = _ok(_cli(stack, "tenants", "show", TENANT, "--json"))
        assert not shown["tenants"][0]["override"]
        _ok(_cli(stack, "tenants", "map", MAPPED_ROLE, TENANT, "--json"))
        assert _ok(_cli(stack, "tenants", "unmap", MAPPED_ROLE, "--json"))["unmapped"]
        # Its DeleteItem reaches tenant settings only, never a task's item.
        assert stack.moto is not None
        dynamodb = boto3.client("dynamodb", endpoint_url=stack.moto.url, region_name=LOCAL_REGION,
                                aws_access_key_id=operator.access_key_id,
                                aws_secret_access_key=operator.secret_access_key)  # fmt: skip
        with pytest.raises(ClientError, match=f"{DENIED}: dynamodb:DeleteItem"):
            dynamodb.delete_item(TableName=stack.resources.table_name,
                                 Key=store_keys.state_key(TENANT, "op-cli"))  # fmt: skip

        # Stats: the CLI's (local: no CloudWatch), and the reader as on AWS.
        figures = _ok(_cli(stack, "stats", "--json"))
        assert figures["dlq"] is not None
        assert stats.read(900)["dlq"] is not None

        assert denials.seen == []


def _archive_directly(stack: LocalStack, request_id: str) -> str:
    """An archived dead letter as the dlq-processor leaves it, put with the admin key."""
    assert stack.resources is not None
    envelope = _standalone(request_id)
    key = archive_key(TENANT, request_id, f"m-{request_id}")
    DlqArchive(_admin(stack)["s3"], stack.resources.bucket).put(ArchivedMessage(
        key=key, message_id=f"m-{request_id}", request_id=request_id, tenant=TENANT,
        body=envelope.to_body(), attributes={}, system_attributes={}, archived_at_ms=now_ms(),
    ))  # fmt: skip
    return key


def _denied_cli(stack: LocalStack, operation: str, *args: str) -> None:
    """The command fails on an AccessDenied of exactly `operation` (S3's denials do
    not name the action, so the operation is what tells which statement is missing)."""
    done = _cli(stack, *args)
    assert done.code != 0, done.stdout[-2000:]
    # moto answers a denied SQS call in XML, which botocore's JSON protocol reads as
    # code "403": the AccessDenied is then in the message.
    assert f" in {operation}:" in done.stderr and "AccessDenied" in done.stderr, done.stderr[-2000:]


def _denied_to_console(operation: str, act: Any) -> None:
    with pytest.raises(ClientError) as raised:
        act()
    assert raised.value.operation_name == operation
    assert "AccessDenied" in str(raised.value), str(raised.value)


# Each statement OperatorPolicy holds beyond ProducerPolicy, in the policy's order.
OPERATOR_ONLY: Final = (
    "ListDeadLetterArchive",
    "ReadDeadLetterArchive",
    "MarkDeadLettersRedriven",
    "DiscardDeadLetters",
    "PeekDeadLetterQueue",
    "ReadQueueDepths",
    "ReadTenantsAndWorkers",
    "SetTenantSettings",
    "RemoveTenantSettings",
    "ReadQueueAgeMetrics",
)
# Two stacks, each without a group of them. Within a group every command still gets as
# far as the call its own statement allows (none needs another statement of the group
# first), so each denial below proves its statement is needed.
REMOVED_TOGETHER: Final = {
    "archive-reads-depths-tenants": (
        "ListDeadLetterArchive", "ReadDeadLetterArchive", "ReadQueueDepths",
        "ReadTenantsAndWorkers", "RemoveTenantSettings",
    ),
    "archive-writes-peek-metrics-tenant-puts": (
        "MarkDeadLettersRedriven", "DiscardDeadLetters", "PeekDeadLetterQueue",
        "ReadQueueAgeMetrics", "SetTenantSettings",
    ),
}  # fmt: skip


def test_iam_enforced_operator_statements_are_exactly_the_producers_and_its_own() -> None:
    policies = synthesized_policies()
    producer = policies["producer"]
    assert policies["operator"][: len(producer)] == producer
    own = policies["operator"][len(producer) :]
    assert [s.get("Sid") for s in own] == list(OPERATOR_ONLY)
    assert sorted(sum(REMOVED_TOGETHER.values(), ())) == sorted(OPERATOR_ONLY)


def _without_archive_reads_depths_tenants(stack: LocalStack, parts: Any) -> None:
    key = _archive_directly(stack, "op-read")
    # ListDeadLetterArchive: `agentq dlq list` and the console's dead letters.
    _denied_cli(stack, "ListObjectsV2", "dlq", "list", "--json")
    _denied_to_console("ListObjectsV2", parts.dead_letters.list)
    # ReadDeadLetterArchive: the console's actions read the letter they act on.
    _denied_to_console("GetObject", lambda: parts.actions.redrive([key]))
    _denied_to_console("GetObject", lambda: parts.actions.discard([key]))
    # ReadQueueDepths: `agentq stats` and the console's queues.
    _denied_cli(stack, "GetQueueAttributes", "stats", "--json")
    _denied_to_console("GetQueueAttributes", parts.operations.snapshot)
    # RemoveTenantSettings: an override and a mapping are set (SetTenantSettings), never
    # removed.
    _ok(_cli(stack, "tenants", "limit", TENANT, "3", "--json"))
    _denied_cli(stack, "DeleteItem", "tenants", "limit", TENANT, "default")
    _ok(_cli(stack, "tenants", "map", MAPPED_ROLE, TENANT, "--json"))
    _denied_cli(stack, "DeleteItem", "tenants", "unmap", MAPPED_ROLE)
    # ReadTenantsAndWorkers: a tenant's limit and seats, the workers' roster.
    _denied_cli(stack, "GetItem", "tenants", "show", TENANT)
    assert stack.resources is not None
    roster = WorkerRoster(parts.operations._client.dynamodb, stack.resources.table_name)
    _denied_to_console("Query", roster.entries)


def _without_archive_writes_peek_metrics(
    stack: LocalStack, parts: Any, stats: StatsReader, denials: Denials
) -> None:
    # PeekDeadLetterQueue: the archive is listed and read, the peek is denied.
    _archive_directly(stack, "op-mark")
    _denied_cli(stack, "ReceiveMessage", "dlq", "list", "--peek", "--json")
    # MarkDeadLettersRedriven: the replay is sent, the letter cannot be marked.
    _denied_cli(stack, "PutObject", "dlq", "redrive", "op-mark", "--json")
    # DiscardDeadLetters: the console reads the letter, its delete is denied.
    key = _archive_directly(stack, "op-discard")
    _denied_to_console("DeleteObject", lambda: parts.actions.discard([key]))
    # ReadQueueAgeMetrics: both readers show the age as unknown; the denial tells why.
    denials.seen.clear()
    assert stats.read(900)["dlq"]["oldestAgeS"] is None
    parts.operations.snapshot()
    assert {d.split(":")[0] for d in denials.seen} == {"GetMetricData", "GetMetricStatistics"}
    assert all(f"{DENIED}: cloudwatch:" in d for d in denials.seen)
    # SetTenantSettings: the producer's rights put no override and no mapping.
    _denied_cli(stack, "PutItem", "tenants", "limit", TENANT, "3")
    _denied_cli(stack, "PutItem", "tenants", "map", MAPPED_ROLE, TENANT)


@pytest.mark.parametrize("group", list(REMOVED_TOGETHER))
def test_iam_enforced_operator_is_denied_without_each_of_its_statements(
    tmp_path: Path, as_operator: Any, group: str
) -> None:
    with _stack(tmp_path, "iamopx", without=REMOVED_TOGETHER[group]) as stack:
        parts, stats, denials = as_operator(stack)
        if group == "archive-reads-depths-tenants":
            _without_archive_reads_depths_tenants(stack, parts)
        else:
            _without_archive_writes_peek_metrics(stack, parts, stats, denials)
