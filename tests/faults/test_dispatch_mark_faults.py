"""A dispatch's `sentAt` marks under AWS faults.

`sentAt` tells a retried dispatch which of its tasks still need their message. A mark
that met a transaction conflict (a worker's lease renewal already holding the item) used
to fail the whole dispatch after the messages were out, and the marks after it were
never tried: tasks already started stayed "never sent" for good.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import drain_bodies, unique_seed

from agentq.client import AgentqClient
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.envelope import TaskEnvelope
from agentq.events import task_event
from agentq.faults.log import read_counts
from agentq.jobs import result_key, task_request_id
from agentq.states import TaskState
from agentq.store.tasks import TaskStore
from lambdas import dispatcher

pytestmark = pytest.mark.timeout(120)
FAN_OUT = ("B1", "B2", "B3")


def _job_with_a_completed(stack: Stack) -> tuple[str, TaskStore]:
    """A job A → (B1, B2, B3) whose A has just COMPLETED (its event not yet dispatched)."""
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="noop", kind="python")
    )
    job_id = f"j{uuid.uuid4().hex[:10]}"
    spec = {
        "tasks": {
            "A": {"definition": "noop"},
            **{key: {"definition": "noop", "depends_on": ["A"]} for key in FAN_OUT},
        }
    }
    AgentqClient.from_env().create_job(spec, job_id=job_id)
    assert [b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url)] == ["A"]
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    a_id = task_request_id(job_id, "A")
    record = tasks.require("default", a_id)
    lease = tasks.acquire(
        TaskEnvelope.from_dict(dict(record.envelope or {}), default_tenant="default"),
        worker_id="w1",
        lease_seconds=60,
        max_attempts=3,
    )
    key = result_key("default", a_id, lease.attempt)
    stack.s3.put_object(Bucket=stack.resources.bucket, Key=key, Body=b"{}")
    tasks.finalize(
        lease,
        TaskState.COMPLETED,
        fields={"result": {"bucket": stack.resources.bucket, "key": key}},
    )
    return job_id, tasks


def _dispatch_a_completed(job_id: str) -> None:
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


def _faults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *rules: dict[str, Any]) -> Path:
    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv("AGENTQ_FAULTS", json.dumps({"rules": list(rules)}))
    monkeypatch.setenv("AGENTQ_FAULTS_SEED", unique_seed())
    monkeypatch.setenv("AGENTQ_FAULTS_LOG", str(log))
    return log


def test_marks_that_meet_transaction_conflicts_are_sent_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job_id, tasks = _job_with_a_completed(stack)
    log = _faults(
        monkeypatch,
        tmp_path,
        {"op": "dynamodb:UpdateItem", "kind": "transaction_conflict", "rate": 1, "limit": 3,
         "match": "sentAt"},
    )  # fmt: skip
    _dispatch_a_completed(job_id)  # the conflicts do not fail the dispatch
    assert read_counts(str(log)) == {"dynamodb:UpdateItem:transaction_conflict": 3}
    sent = sorted(b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url))
    assert sent == list(FAN_OUT)
    for key in FAN_OUT:
        record = tasks.require("default", task_request_id(job_id, key))
        assert record.state is TaskState.PENDING
        assert "sentAt" in record.raw, key


def test_one_mark_that_keeps_failing_does_not_leave_the_others_unmarked(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job_id, tasks = _job_with_a_completed(stack)
    # Every attempt botocore makes of the first mark fails (agentq.aws: 1 + 5 retries).
    log = _faults(
        monkeypatch,
        tmp_path,
        {"op": "dynamodb:UpdateItem", "kind": "server_error", "rate": 1, "limit": 6,
         "match": "SET sentAt = :now"},
    )  # fmt: skip
    with pytest.raises(ClientError):
        _dispatch_a_completed(job_id)  # failed: the event is delivered again
    assert read_counts(str(log)) == {"dynamodb:UpdateItem:server_error": 6}
    sent = sorted(b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url))
    assert sent == list(FAN_OUT)
    marked = ["sentAt" in tasks.require("default", task_request_id(job_id, key)).raw
              for key in FAN_OUT]  # fmt: skip
    assert sorted(marked) == [False, True, True]
