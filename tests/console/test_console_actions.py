"""Console actions through its API on in-process moto: each does its work through
agentq's own parts and leaves an `Operator Action` event naming the operator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Stack
from console_support import Http, define, running_console
from support import EventLog

from agentq.client import AgentqClient
from agentq.dlq import ArchivedMessage, DlqArchive, archive_key
from agentq.envelope import TaskEnvelope
from agentq.states import TaskState


@pytest.fixture
def http(inproc_stack: Stack) -> Iterator[Http]:
    define(inproc_stack, "noop")
    with running_console(allow_actions=True) as server:
        signed = Http(server)
        signed.sign_in()
        yield signed


def _dead_letter(stack: Stack, client: AgentqClient, request_id: str) -> ArchivedMessage:
    """A task failed by the dlq-processor, with its letter in the archive."""
    envelope = TaskEnvelope(request_id=request_id, tenant="default", definition="noop")
    client.tasks.create(envelope)
    client.tasks.transition("default", request_id, from_states=[TaskState.PENDING],
                            to_state=TaskState.FAILED)  # fmt: skip
    letter = ArchivedMessage(
        key=archive_key("default", request_id, f"m-{request_id}"),
        message_id=f"m-{request_id}", request_id=request_id, tenant="default",
        body=envelope.to_body(), attributes=envelope.message_attributes(),  # type: ignore[arg-type]
        system_attributes={"ApproximateReceiveCount": "3"}, archived_at_ms=1, outcome="failed",
    )  # fmt: skip
    DlqArchive(stack.s3, stack.resources.bucket).put(letter)
    return letter


def _queued(stack: Stack) -> list[str]:
    got = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10)
    return [json.loads(m["Body"])["requestId"] for m in got.get("Messages", [])]


def test_redrive_replays_each_selected_letter_once_and_records_it(
    inproc_stack: Stack, http: Http
) -> None:
    client = AgentqClient.from_env()
    letters = [_dead_letter(inproc_stack, client, rid) for rid in ("dl-1", "dl-2")]
    reply = http.act("redrive", {"keys": [m.key for m in letters]}, csrf=http.csrf())
    assert reply.status == 200, reply.text
    assert [r["outcome"] for r in reply.json()["results"]] == ["redriven", "redriven"]
    assert sorted(_queued(inproc_stack)) == ["dl-1", "dl-2"]
    assert client.get_task("dl-1").state is TaskState.PENDING
    again = http.act("redrive", {"keys": [letters[0].key]}, csrf=http.csrf()).json()
    assert again["results"][0]["outcome"] == "skipped"  # already redriven: not run twice
    recorded = EventLog(inproc_stack).of("dl-1", "Operator Action")
    assert [e["payload"]["outcome"] for e in recorded] == ["redriven", "skipped"]
    assert recorded[0]["payload"]["operator"]["account"]


def test_discard_removes_letters_after_recording_them(inproc_stack: Stack, http: Http) -> None:
    client = AgentqClient.from_env()
    letter = _dead_letter(inproc_stack, client, "dl-3")
    reply = http.act("discard", {"keys": [letter.key]}, csrf=http.csrf())
    assert reply.json()["results"] == [{"key": letter.key, "requestId": "dl-3",
                                        "outcome": "discarded"}]  # fmt: skip
    assert DlqArchive(inproc_stack.s3, inproc_stack.resources.bucket).list() == []
    assert http.request("GET", "/api/dlq").json() == {"letters": []}
    [event] = EventLog(inproc_stack).of("dl-3", "Operator Action")
    assert event["payload"]["archiveKey"] == letter.key
    gone = http.act("discard", {"keys": [letter.key]}, csrf=http.csrf())
    assert gone.status == 404 and "dead letter" in gone.json()["detail"]
    # Keys that are not archive keys are refused before anything is read.
    for keys in ([], ["task/logs/x/secret.json"], [{"a": 1}], "dlq/archive/a/b/c.json"):
        assert http.act("discard", {"keys": keys}, csrf=http.csrf()).status == 400, keys


def test_cancel_a_job_and_resubmit_a_finished_task(inproc_stack: Stack, http: Http) -> None:
    client = AgentqClient.from_env()
    client.create_job({"tasks": {"a": {"definition": "noop"},
                                 "b": {"definition": "noop", "depends_on": ["a"]}}}, job_id="j")  # fmt: skip
    reply = http.act("cancel", {"jobId": "j"}, csrf=http.csrf())
    assert sorted(reply.json()["cancelled"]) == ["j-a", "j-b"]
    assert client.get_job("j").state == "FAILED"
    job_events = [
        e for e in EventLog(inproc_stack).poll() if e["detail-type"] == "Job Operator Action"
    ]
    assert job_events[0]["payload"]["cancelled"] and job_events[0]["jobId"] == "j"

    again = http.act("resubmit", {"requestId": "j-a"}, csrf=http.csrf())
    new_id = again.json()["requestId"]
    assert new_id != "j-a"
    fresh = client.get_task(new_id)
    assert fresh.state is TaskState.PENDING and fresh.definition == "noop"
    [event] = EventLog(inproc_stack).of("j-a", "Operator Action")
    assert event["payload"] == {**event["payload"], "action": "resubmit", "newRequestId": new_id}
    assert http.act("resubmit", {"requestId": "no-such"}, csrf=http.csrf()).status == 404
    assert http.act("nonsense", {}, csrf=http.csrf()).status == 404
