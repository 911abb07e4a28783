"""Submitting a task with its own `resume` (the client): it is queued in the envelope
and shown by the task views; one for a definition that is not an agent's is refused
before anything is queued. Real boto3 against moto; the worker's side is in
test_agent_resume_override.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack

from agentq.client import AgentqClient
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.errors import InvalidInput
from agentq.jobs import task_request_id
from agentq.jobs.summary import task_dict
from agentq.store.tenants import TenantLimitStore

AGENT = {"prompt": "Note {text}", "output_schema": {"type": "object"}}


def _client(stack: Stack) -> AgentqClient:
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    table.put(TaskDefinition(name="notes", kind="agent", settings=AGENT))
    table.put(TaskDefinition(name="kept", kind="agent", settings={**AGENT, "resume": True}))
    table.put(TaskDefinition(name="noop", kind="python"))
    return AgentqClient.from_env()


def _queued(stack: Stack) -> list[dict[str, Any]]:
    """The task queue's message bodies (received and hidden)."""
    reply = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url,
                                      MaxNumberOfMessages=10, VisibilityTimeout=300)  # fmt: skip
    return [json.loads(m["Body"]) for m in reply.get("Messages", [])]


@pytest.mark.parametrize(("definition", "resume"), [("notes", True), ("kept", False)])
def test_a_tasks_own_resume_is_queued_and_shown(
    inproc_stack: Stack, definition: str, resume: bool
) -> None:
    client = _client(inproc_stack)
    record = client.submit(definition, {"text": "x"}, tenant="acme", resume=resume)
    assert record.envelope is not None and record.envelope["resume"] is resume
    [body] = _queued(inproc_stack)
    assert body["requestId"] == record.request_id and body["resume"] is resume
    # `agentq status` and the API's task view say the task decides for itself.
    assert task_dict(client.get_task(record.request_id, tenant="acme"))["resume"] is resume


def test_without_resume_the_definition_decides_and_nothing_is_written(inproc_stack: Stack) -> None:
    client = _client(inproc_stack)
    record = client.submit("kept", {"text": "x"}, tenant="acme")
    [body] = _queued(inproc_stack)
    assert "resume" not in body and "resume" not in (record.envelope or {})
    assert task_dict(client.get_task(record.request_id, tenant="acme"))["resume"] is None


@pytest.mark.parametrize("resume", [True, False])
def test_resume_for_a_definition_that_is_not_an_agents_is_refused(
    inproc_stack: Stack, resume: bool
) -> None:
    client = _client(inproc_stack)
    with pytest.raises(InvalidInput) as refused:
        client.submit("noop", {}, tenant="acme", resume=resume)
    assert refused.value.field == "resume"
    assert "'noop' is a python definition: only an agent task" in refused.value.problem
    # A job task too: nothing is created for it.
    client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id="j", tenant="acme")
    with pytest.raises(InvalidInput) as refused:
        client.submit("noop", {}, tenant="acme", job_id="j", resume=resume)
    assert refused.value.field == "resume"
    assert client.get_job("j", tenant="acme").spec.keys == ["a"]
    assert [b["taskKey"] for b in _queued(inproc_stack)] == ["a"]


def test_a_task_added_to_a_job_keeps_its_own_resume(inproc_stack: Stack) -> None:
    client = _client(inproc_stack)
    client.create_job({"tasks": {"a": {"definition": "noop"}}}, job_id="j", tenant="acme")
    record = client.submit("kept", {"text": "x"}, tenant="acme", job_id="j",
                           idempotency_key="late", resume=False)  # fmt: skip
    key = record.raw["taskKey"]
    assert record.request_id == task_request_id("j", key)
    assert client.get_job("j", tenant="acme").spec.task(key).resume is False
    sent = {b["taskKey"]: b for b in _queued(inproc_stack)}
    assert sent[key]["resume"] is False and "resume" not in sent["a"]


def test_resume_on_is_not_refused_for_a_tenant_without_transcripts(inproc_stack: Stack) -> None:
    """The worker records the resume as off, with its reason (test_agent_resume_override)."""
    client = _client(inproc_stack)
    TenantLimitStore(inproc_stack.dynamodb, inproc_stack.resources.table_name).set_transcripts(
        "acme", stored=False
    )
    record = client.submit("notes", {"text": "x"}, tenant="acme", resume=True)
    assert [b["resume"] for b in _queued(inproc_stack)] == [True]
    assert record.envelope is not None and record.envelope["resume"] is True


def test_the_conversation_view_follows_the_tasks_own_resume(inproc_stack: Stack) -> None:
    client = _client(inproc_stack)
    off = client.submit("kept", {"text": "x"}, tenant="acme", resume=False)
    note = client.conversation(off.request_id, tenant="acme").note
    assert note == "no conversation stored (resume off for this task)"
    on = client.submit("notes", {"text": "x"}, tenant="acme", resume=True)
    assert client.conversation(on.request_id, tenant="acme").note == "no checkpoint yet"
    plain = client.submit("notes", {"text": "x"}, tenant="acme")
    note = client.conversation(plain.request_id, tenant="acme").note
    assert note == "no conversation stored (resume off for this definition)"
