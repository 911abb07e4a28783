"""Submitting a continuation (agentq.continuation, the client): what can be continued is
decided from the source's STATE item, read under the submitter's tenant, before anything
is queued. Real boto3 against moto; the worker's side is in test_agent_continue.py."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack

from agentq.client import AgentqClient
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.envelope import MAX_FOLLOW_UP, TaskEnvelope
from agentq.errors import InvalidInput
from agentq.jobs import request_id_for, result_key
from agentq.jobs.summary import task_dict
from agentq.states import TaskState
from agentq.store import TaskStore
from agentq.store.keys import checkpoint_key

AGENT = {"prompt": "Note {text}", "output_schema": {"type": "object"}}


def _client(stack: Stack) -> AgentqClient:
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    table.put(TaskDefinition(name="notes", kind="agent", settings={**AGENT, "resume": True}))
    table.put(TaskDefinition(name="noop", kind="python"))
    return AgentqClient.from_env()


def _finished(
    stack: Stack,
    request_id: str,
    *,
    tenant: str = "acme",
    state: TaskState = TaskState.COMPLETED,
    checkpoint: str | None = "own",
) -> None:
    """A task run and finalized as the worker does."""
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    envelope = TaskEnvelope(request_id=request_id, tenant=tenant, definition="notes",
                            input={"text": "x"})  # fmt: skip
    lease = store.acquire(envelope, worker_id="w", lease_seconds=60, max_attempts=3)
    fields: dict[str, Any] = {}
    if state is TaskState.COMPLETED:
        key = result_key(tenant, request_id, lease.attempt)
        fields["result"] = {"bucket": stack.resources.bucket, "key": key}
        if checkpoint == "own":
            fields["checkpoint"] = {"bucket": stack.resources.bucket,
                                    "key": checkpoint_key(tenant, request_id, lease.attempt)}  # fmt: skip
        elif checkpoint is not None:
            fields["checkpoint"] = {"bucket": stack.resources.bucket, "key": checkpoint}
    store.finalize(lease, state, fields=fields)


def _queued(stack: Stack) -> int:
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.resources.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def test_a_continuation_is_queued_with_its_source_and_follow_up(inproc_stack: Stack) -> None:
    client = _client(inproc_stack)
    _finished(inproc_stack, "src-1")
    # No `text` input: a continuation's prompt is its follow-up, not the definition's.
    record = client.submit("notes", tenant="acme", continues="src-1", prompt="And then?")
    assert record.request_id != "src-1"
    assert record.envelope is not None
    assert record.envelope["continues"] == "src-1"
    assert record.envelope["prompt"] == "And then?"
    assert _queued(inproc_stack) == 1
    # `agentq status` and the API's task view name the task it continues.
    assert task_dict(client.get_task(record.request_id, tenant="acme"))["continues"] == "src-1"
    assert task_dict(client.get_task("src-1", tenant="acme"))["continues"] is None


@pytest.mark.parametrize(
    ("case", "field", "words"),
    [
        ("missing", "continues", "task src-1 was not found"),
        ("other-tenant", "continues", "task src-1 was not found"),
        ("failed", "continues", "is FAILED: only a COMPLETED task can be continued"),
        ("no-checkpoint", "continues", "left no session checkpoint to continue from"),
        ("foreign-checkpoint", "continues", "outside its winning attempt's objects"),
        ("python", "definition", "only an agent task can continue another"),
        ("no-prompt", "prompt", "is required to continue a task"),
        ("prompt-alone", "prompt", "only for a task that continues another"),
        ("itself", "continues", "cannot continue itself"),
        ("bad-id", "continues", "must match"),
        ("in-a-job", "continues", "a job task continues another"),
    ],
)
def test_a_continuation_that_cannot_start_is_refused_at_submit(
    inproc_stack: Stack, case: str, field: str, words: str
) -> None:
    client = _client(inproc_stack)
    if case == "other-tenant":
        _finished(inproc_stack, "src-1", tenant="zeta")  # tenant B's task of that id
    elif case == "failed":
        _finished(inproc_stack, "src-1", state=TaskState.FAILED)
    elif case == "no-checkpoint":
        _finished(inproc_stack, "src-1", checkpoint=None)  # its definition had resume off
    elif case == "foreign-checkpoint":
        # A pointer that is not the winning attempt's own (another tenant's object).
        _finished(inproc_stack, "src-1", checkpoint=checkpoint_key("zeta", "src-1", 1))
    elif case != "missing":
        _finished(inproc_stack, "src-1")
    kwargs: dict[str, Any] = {"tenant": "acme", "continues": "src-1", "prompt": "And then?"}
    definition = "notes"
    if case == "python":
        definition = "noop"
    elif case == "no-prompt":
        kwargs.pop("prompt")
    elif case == "prompt-alone":
        kwargs.pop("continues")
    elif case == "itself":
        kwargs["idempotency_key"] = "k"
        kwargs["continues"] = request_id_for("acme", "k")
    elif case == "bad-id":
        kwargs["continues"] = "no spaces allowed"
    elif case == "in-a-job":
        kwargs["job_id"] = "j-1"
    with pytest.raises(InvalidInput) as refused:
        client.submit(definition, **kwargs)
    assert refused.value.field == field
    assert words in refused.value.problem
    assert _queued(inproc_stack) == 0


def test_a_follow_up_is_bounded_like_a_prompt_value() -> None:
    with pytest.raises(InvalidInput) as refused:
        TaskEnvelope(request_id="r-2", tenant="acme", definition="notes", continues="r-1",
                     prompt="x" * (MAX_FOLLOW_UP + 1))  # fmt: skip
    assert refused.value.field == "prompt"
    with pytest.raises(InvalidInput):
        TaskEnvelope(request_id="r-2", tenant="acme", definition="notes", continues="r-1",
                     prompt="\ud800")  # fmt: skip
