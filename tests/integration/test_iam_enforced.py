"""The local stack with IAM enforced: a job runs through the worker and every Lambda, each
signing with exactly its synthesized policy, and a permission taken away is noticed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_support import Ran, agentq
from support import wait_for

from agentq.client import AgentqClient
from agentq.dlq import DLQ_REASON, DlqArchive
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.local.aws import LOCAL_CREDENTIALS, local_session_clients
from agentq.local.lambda_procs import FUNCTIONS
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.states import TaskState
from agentq.store import TaskStore

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DENIED = "not authorized to perform"


def _stack(
    tmp_path: Path, stage: str, without: dict[str, str] | None = None, *, workers: int = 1
) -> LocalStack:
    options = LocalStackOptions(
        stage=stage,
        workers=workers,
        definitions_dirs=(SAMPLE_DEFINITIONS,),
        health_interval_s=1.0,
        worker_env=fast_env(),
        work_dir=tmp_path,
        iam=True,
        iam_without=without or {},
    )
    return LocalStack(options)


@pytest.fixture
def enforced(tmp_path: Path) -> Iterator[LocalStack]:
    with _stack(tmp_path, "iame2e") as stack:
        yield stack


def _denials(stack: LocalStack) -> dict[str, list[str]]:
    found = {f: [line for line in stack.lambda_host.output(f).splitlines() if DENIED in line]
             for f in FUNCTIONS}  # fmt: skip
    found["worker"] = [line for line in stack.workers[0].output().splitlines() if DENIED in line]
    return {name: lines for name, lines in found.items() if lines}


def _cli(env: dict[str, str], *args: str) -> Ran:
    return agentq(env, *args)


def test_iam_enforced_job_runs_through_worker_and_lambdas(enforced: LocalStack) -> None:
    stack = enforced
    assert stack.resources is not None and stack.moto is not None
    # This process is a producer: its environment holds the producer's key, not the operator's.
    assert os.environ["AWS_ACCESS_KEY_ID"] == stack.credentials["producer"].access_key_id
    # A worker that died at start reads as an empty environment (a zombie's): say why.
    assert stack.workers[0].alive(), stack.workers[0].output()[-4000:]
    worker_env = psutil.Process(stack.workers[0].pid).environ()
    assert worker_env["AWS_ACCESS_KEY_ID"] == stack.credentials["worker"].access_key_id
    assert LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"] not in {
        c.access_key_id for c in stack.credentials.values()
    }

    client = AgentqClient.from_env()
    spec = {"tasks": {"A": {"definition": "sample-echo", "input": {"v": 1}},
                      "B": {"definition": "sample-echo", "input": {"a": "${tasks.A.result}"}}}}  # fmt: skip
    client.create_job(spec, job_id="iam-job")
    job = client.wait(job_id="iam-job", timeout_s=120, poll_s=0.2)
    assert job.state == "COMPLETED", stack.workers[0].output()[-3000:]
    assert client.result("iam-job-B") == {"a": {"v": 1}}  # the dispatcher passed A's result on
    # save-event stored the worker's events with its own key.
    wait_for(lambda: "Task Completed" in [e["detailType"] for e in client.events("iam-job-B")],
             timeout=30, message="Task Completed stored")  # fmt: skip

    # The CLI in another shell, with the stack's env file, is a producer too: it submits
    # and reads results, and an operator's command is denied to it.
    shell = {**os.environ, **stack.env()}
    submitted = _cli(shell, "submit", "sample-echo", "--input", '{"cli": 1}', "--wait",
                     "--timeout", "90", "--json")  # fmt: skip
    assert submitted.code == 0, submitted.stderr[-2000:]
    request_id = json.loads(submitted.stdout)["requestId"]
    status = _cli(shell, "status", request_id, "--result", "--json")
    assert status.code == 0 and json.loads(status.stdout)["output"] == {"cli": 1}
    assert _cli(shell, "dlq", "list", "--json").code != 0

    # A dead letter: the dlq-processor polls the DLQ, closes the task and archives it.
    operator = local_session_clients(stack.moto.url)
    tasks = TaskStore(operator["dynamodb"], stack.resources.table_name)
    envelope = TaskEnvelope(request_id="iam-dead", tenant="acme", definition="sample-echo",
                            input={"v": 2})  # fmt: skip
    tasks.create(envelope)
    # Its only attempt spent (a holder that died): no attempt left to return it for.
    spent = tasks.acquire(envelope, worker_id="w-gone", lease_seconds=0.05, max_attempts=1)
    wait_for(lambda: now_ms() > spent.effective_until_ms, timeout=5, message="lease lapse")
    operator["sqs"].send_message(QueueUrl=stack.resources.dlq_url, MessageBody=envelope.to_body(),
                                 MessageAttributes=envelope.message_attributes())  # fmt: skip
    record = wait_for(lambda: (r := tasks.get("acme", "iam-dead")) and r.state.terminal and r,
                      timeout=60, message="the dead letter closed out")  # fmt: skip
    assert record.state is TaskState.FAILED
    assert record.raw["error"]["message"] == DLQ_REASON
    archive = DlqArchive(operator["s3"], stack.resources.bucket)
    wait_for(archive.list, timeout=30,
             message="the dead letter archived")  # fmt: skip
    # A dead letter whose producer never wrote the STATE item: the processor creates it
    # (its one PutItem); the task never ran, so the processor sends it back to the task
    # queue (sqs:SendMessage on its role) and a worker runs it.
    orphan = TaskEnvelope(request_id="iam-orphan", tenant="acme", definition="sample-echo",
                          input={"v": 3})  # fmt: skip
    operator["sqs"].send_message(QueueUrl=stack.resources.dlq_url, MessageBody=orphan.to_body(),
                                 MessageAttributes=orphan.message_attributes())  # fmt: skip
    closed = wait_for(lambda: (r := tasks.get("acme", "iam-orphan")) and r.state.terminal and r,
                      timeout=90, message="the orphan dead letter run")  # fmt: skip
    assert closed.state is TaskState.COMPLETED
    assert closed.raw["dlqReturns"] == 1
    # The health check ran (it reads the status index and the queues) and nothing was denied.
    wait_for(lambda: stack.lambda_host.output("health-check").count("\n") >= 1, timeout=30,
             message="the health check host up")  # fmt: skip
    assert all(stack.lambda_host.alive().values())
    assert _denials(stack) == {}


def test_iam_enforced_run_notices_a_permission_taken_away(tmp_path: Path) -> None:
    # save-event without dynamodb:PutItem: tasks still run, but no event is ever stored,
    # and the denial names the missing action. The dlq-processor without
    # sqs:ReceiveMessage leaves a dead letter in the DLQ, which the health check (with
    # its own role) reports without being denied anything.
    without = {"save-event": "dynamodb:PutItem", "dlq-processor": "sqs:ReceiveMessage"}
    with _stack(tmp_path, "iamless", without) as stack:
        assert stack.resources is not None and stack.moto is not None
        client = AgentqClient.from_env()
        task = client.submit("sample-echo", {"v": 3})
        record = client.wait(task.request_id, timeout_s=90, poll_s=0.2)
        assert record.state == TaskState.COMPLETED
        wait_for(lambda: f"{DENIED}: dynamodb:PutItem" in stack.lambda_host.output("save-event"),
                 timeout=60, message="the save-event denial")  # fmt: skip
        assert client.events(task.request_id) == []

        envelope = TaskEnvelope(request_id="iam-stays", tenant="acme", definition="sample-echo",
                                input={})  # fmt: skip
        operator = local_session_clients(stack.moto.url)
        operator["sqs"].send_message(QueueUrl=stack.resources.dlq_url,
                                     MessageBody=envelope.to_body(),
                                     MessageAttributes=envelope.message_attributes())  # fmt: skip
        wait_for(lambda: f"{DENIED}: sqs:ReceiveMessage" in stack.lambda_host.output("dlq-processor"),
                 timeout=60, message="the dlq-processor denial")  # fmt: skip
        wait_for(lambda: "dlq" in stack.lambda_host.output("health-check").lower(), timeout=60,
                 message="the health check reporting the DLQ")  # fmt: skip
        assert set(_denials(stack)) == {"save-event", "dlq-processor"}


@pytest.mark.parametrize("granted", [True, False], ids=["synthesized", "without-SendMessage"])
def test_iam_enforced_worker_requeues_a_task_held_elsewhere(tmp_path: Path, granted: bool) -> None:
    # A task whose lease a dead worker holds, its message already received twice: the
    # worker backs off by requeueing a fresh copy (sqs:SendMessage), so the wait does
    # not spend the receives SQS allows before it dead-letters the message. The lease
    # is taken once the worker is up, so however slowly it starts the lease is still
    # held when the message reaches it (long enough, without the grant, never to lapse).
    without = {} if granted else {"worker": "sqs:SendMessage"}
    with _stack(tmp_path, "iamrq" if granted else "iamnorq", without, workers=0) as stack:
        assert stack.resources is not None and stack.moto is not None
        operator = local_session_clients(stack.moto.url)
        tasks = TaskStore(operator["dynamodb"], stack.resources.table_name)
        envelope = TaskEnvelope(request_id="iam-held", tenant="acme", definition="sample-echo",
                                input={"v": 4})  # fmt: skip
        tasks.create(envelope)
        queue = stack.resources.queue_url
        operator["sqs"].send_message(QueueUrl=queue, MessageBody=envelope.to_body(),
                                     MessageAttributes=envelope.message_attributes())  # fmt: skip
        (received,) = operator["sqs"].receive_message(
            QueueUrl=queue, WaitTimeSeconds=2, VisibilityTimeout=600
        )["Messages"]
        worker = stack.add_worker("requeuer")
        worker.wait_for_output("worker started", timeout=90)
        tasks.acquire(envelope, worker_id="dead-worker", lease_seconds=8 if granted else 600,
                      max_attempts=3)  # fmt: skip
        operator["sqs"].change_message_visibility(
            QueueUrl=queue, ReceiptHandle=received["ReceiptHandle"], VisibilityTimeout=0
        )
        if granted:
            record = wait_for(lambda: (r := tasks.get("acme", "iam-held")) and r.state.terminal and r,
                              timeout=90, message="the takeover")  # fmt: skip
            assert record.state is TaskState.COMPLETED
            assert "requeued as a fresh copy" in worker.output()
            assert _denials(stack) == {}
        else:
            wait_for(lambda: f"{DENIED}: sqs:SendMessage" in worker.output(), timeout=60,
                     message="the worker's requeue denied")  # fmt: skip
            assert "requeue failed; giving the message back in place" in worker.output()
