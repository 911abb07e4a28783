"""With IAM enforced, what readers of S3 meet on AWS: a producer lists and reads its
task's outputs (`agentq logs`, `agentq trace`, `AgentqClient.artifacts`) under the task
prefix only, and the dispatcher, which may not list the bucket, gets S3's 403 for a
result that is missing and fails the dependent task instead of raising."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from cli_support import Ran, agentq
from support import wait_for

from agentq.client import AgentqClient
from agentq.envelope import TaskEnvelope
from agentq.events import task_event
from agentq.jobs import result_key, task_request_id
from agentq.local.aws import LOCAL_REGION, local_session_clients
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.states import TaskState
from agentq.store import TaskStore

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _stack(tmp_path: Path, stage: str, *, workers: int) -> LocalStack:
    return LocalStack(LocalStackOptions(
        stage=stage, workers=workers, definitions_dirs=(SAMPLE_DEFINITIONS,),
        health_interval_s=0, worker_env=fast_env(), work_dir=tmp_path, iam=True,
    ))  # fmt: skip


def _cli(env: dict[str, str], *args: str) -> Ran:
    return agentq(env, *args)


@pytest.fixture
def with_worker(tmp_path: Path) -> Iterator[LocalStack]:
    with _stack(tmp_path, "iamreads", workers=1) as stack:
        yield stack


@pytest.fixture
def without_workers(tmp_path: Path) -> Iterator[LocalStack]:
    with _stack(tmp_path, "iamgone", workers=0) as stack:
        yield stack


def test_iam_enforced_producer_reads_logs_trace_and_artifacts(with_worker: LocalStack) -> None:
    stack = with_worker
    assert stack.resources is not None
    shell = {**os.environ, **stack.env()}
    files = {"logs/run.log": "step one\n",
             "traces/session_trace.json": json.dumps({"turns": 1})}  # fmt: skip
    submitted = _cli(shell, "submit", "sample-artifacts", "--input", json.dumps({"files": files}),
                     "--wait", "--timeout", "90", "--json")  # fmt: skip
    assert submitted.code == 0, submitted.stderr[-2000:]
    request_id = json.loads(submitted.stdout)["requestId"]

    logs = _cli(shell, "logs", request_id)
    assert logs.code == 0 and "step one" in logs.stdout, logs.stderr[-2000:]
    trace = _cli(shell, "trace", request_id, "--json")
    assert trace.code == 0 and '"turns"' in trace.stdout, trace.stderr[-2000:]
    client = AgentqClient.from_env()
    assert "logs/run.log" in client.artifacts(request_id)
    # Listing is the producer's under the task prefix only.
    assert stack.moto is not None
    producer = stack.credentials["producer"]
    s3 = boto3.client("s3", endpoint_url=stack.moto.url, region_name=LOCAL_REGION,
                      aws_access_key_id=producer.access_key_id,
                      aws_secret_access_key=producer.secret_access_key)  # fmt: skip
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix="dlq/archive/")


def test_iam_enforced_dispatcher_fails_the_dependent_of_a_missing_result(
    without_workers: LocalStack,
) -> None:
    stack = without_workers
    assert stack.resources is not None and stack.moto is not None
    client = AgentqClient.from_env()  # the producer
    spec = {"tasks": {"A": {"definition": "sample-echo", "input": {"v": 1}},
                      "B": {"definition": "sample-echo", "input": {"a": "${tasks.A.result}"}}}}  # fmt: skip
    client.create_job(spec, job_id="gone")
    tenant = client.get_task(task_request_id("gone", "A")).tenant
    # A completes, as a worker records it, but its result never reached S3.
    operator = local_session_clients(stack.moto.url)
    tasks = TaskStore(operator["dynamodb"], stack.resources.table_name)
    record = tasks.require(tenant, task_request_id("gone", "A"))
    envelope = TaskEnvelope.from_dict(record.envelope or {}, default_tenant=tenant)
    lease = tasks.acquire(envelope, worker_id="w-test", lease_seconds=60, max_attempts=3)
    key = result_key(tenant, envelope.request_id, lease.attempt)
    tasks.finalize(lease, TaskState.COMPLETED,
                   fields={"result": {"bucket": stack.resources.bucket, "key": key}})  # fmt: skip
    event = task_event("Task Completed", request_id=envelope.request_id, tenant=tenant,
                       job_id="gone", attempt=lease.attempt)  # fmt: skip
    operator["events"].put_events(
        Entries=[event.to_entry(source="agentq", bus_name=stack.resources.bus_name)]
    )

    # The dispatcher reads A's result with its own key: S3 says 403 (it may not list
    # the bucket), which means "not there" to it, and B fails instead of waiting forever.
    b = wait_for(lambda: (r := tasks.get(tenant, task_request_id("gone", "B")))
                 and r.state.terminal and r, timeout=60,
                 message="B failed")  # fmt: skip
    assert b.state is TaskState.FAILED
    assert b.raw["error"]["category"] == "not_found"
    assert "AccessDenied" in b.raw["error"]["message"]
