"""Helpers for fault tests: clients of the test stage with a given fault spec installed."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from conftest import Stack

from agentq.aws import make_client, new_session
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION


def rule(op: str, kind: Kind, rate: float = 1.0, **extra: Any) -> FaultRule:
    return FaultRule(op=op, kind=kind, rate=rate, **extra)


def injector(*rules: FaultRule, seed: int = 7) -> FaultInjector:
    return FaultInjector(FaultSpec(rules=rules), seed=seed)


class Attempts:
    """HTTP attempts per operation (retries included): botocore asks `needs-retry` once
    after every attempt, whether it got an answer or a connection error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def attach(self, client: Any) -> Any:
        client.meta.events.register("needs-retry", self._count)
        return client

    def _count(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.counts[event_name.rsplit(".", 1)[-1]] += 1


def faulty_client(stack: Stack, service: str, faults: FaultInjector) -> Any:
    """A client built the way agentq builds them, with `faults` installed."""
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    client = make_client(session, service, endpoint_url=stack.resources.endpoint_for(service))
    return install(client, faults)


def drain_bodies(stack: Stack, queue_url: str) -> list[dict[str, Any]]:
    """Every message now visible on a queue, deleted as read (bodies parsed as JSON)."""
    import json

    seen: list[dict[str, Any]] = []
    while messages := stack.sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
    ).get("Messages", []):
        seen.extend(json.loads(m["Body"]) for m in messages)
        stack.sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
    return seen


def unique_seed() -> str:
    """A seed of its own per test: the process keeps one injector per environment, and
    a rule's `limit` must not be spent by an earlier test with the same spec."""
    import uuid

    return str(uuid.uuid4().int % 2**31)


def job_with_a_completed(stack: Stack, dependents: tuple[str, ...]) -> tuple[str, Any]:
    """A job A → `dependents` whose A has just COMPLETED (its event not yet dispatched):
    (job id, the stage's TaskStore)."""
    import uuid

    from agentq.client import AgentqClient
    from agentq.definitions import DefinitionsTable, TaskDefinition
    from agentq.jobs import result_key, task_request_id
    from agentq.states import TaskState
    from agentq.store.tasks import TaskStore

    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="noop", kind="python")
    )
    job_id = f"j{uuid.uuid4().hex[:10]}"
    spec = {
        "tasks": {
            "A": {"definition": "noop"},
            **{key: {"definition": "noop", "depends_on": ["A"]} for key in dependents},
        }
    }
    AgentqClient.from_env().create_job(spec, job_id=job_id)
    assert [b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url)] == ["A"]
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    a_id = task_request_id(job_id, "A")
    lease = acquire_as_worker(tasks, a_id)
    key = result_key("default", a_id, lease.attempt)
    stack.s3.put_object(Bucket=stack.resources.bucket, Key=key, Body=b"{}")
    tasks.finalize(
        lease,
        TaskState.COMPLETED,
        fields={"result": {"bucket": stack.resources.bucket, "key": key}},
    )
    return job_id, tasks


def dispatch_a_completed(job_id: str) -> None:
    """The dispatcher Lambda's handler, given A's `Task Completed` as the bus delivers it."""
    from agentq.events import task_event
    from agentq.jobs import task_request_id
    from lambdas import dispatcher

    event = task_event(
        "Task Completed",
        request_id=task_request_id(job_id, "A"),
        tenant="default",
        job_id=job_id,
        attempt=1,
    )
    dispatcher.handler(
        {
            "version": "0",
            "id": event.event_id,
            "detail-type": event.detail_type,
            "source": "agentq",
            "time": event.timestamp,
            "detail": event.to_detail(),
        },
        None,
    )


def acquire_as_worker(tasks: Any, request_id: str) -> Any:
    """The lease a worker `w1` takes on a task of tenant `default` (its first attempt)."""
    from agentq.envelope import TaskEnvelope

    record = tasks.require("default", request_id)
    return tasks.acquire(
        TaskEnvelope.from_dict(dict(record.envelope or {}), default_tenant="default"),
        worker_id="w1",
        lease_seconds=60,
        max_attempts=3,
    )


def set_faults(monkeypatch: Any, tmp_path: Any, *rules: dict[str, Any]) -> Any:
    """AGENTQ_FAULTS with `rules` for the processes and clients built from now on, a
    seed of its own, and the fault log's path (returned)."""
    import json

    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv("AGENTQ_FAULTS", json.dumps({"rules": list(rules)}))
    monkeypatch.setenv("AGENTQ_FAULTS_SEED", unique_seed())
    monkeypatch.setenv("AGENTQ_FAULTS_LOG", str(log))
    return log
