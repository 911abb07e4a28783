"""Console actions through its API on in-process moto: each does its work through
agentq's own parts and leaves an `Operator Action` event naming the operator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Stack
from console_support import Http, define, running_console
from support import EventLog

from agentq.aws import AwsClients
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console import ConsoleOptions, ConsoleServer
from agentq.console.server import build_parts
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.dlq import ArchivedMessage, DlqArchive, archive_key
from agentq.envelope import TaskEnvelope
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
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
    got = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10,
                                    WaitTimeSeconds=0)  # fmt: skip
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
    assert http.request("GET", "/api/dlq").json() == {"letters": [], "total": 0}
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

    again = http.act("resubmit", {"requestId": "j-a", "nonce": http.nonce()}, csrf=http.csrf())
    new_id = again.json()["requestId"]
    assert new_id != "j-a"
    fresh = client.get_task(new_id)
    assert fresh.state is TaskState.PENDING and fresh.definition == "noop"
    [event] = EventLog(inproc_stack).of("j-a", "Operator Action")
    assert event["payload"] == {**event["payload"], "action": "resubmit", "newRequestId": new_id}
    missing = {"requestId": "no-such", "nonce": http.nonce()}
    assert http.act("resubmit", missing, csrf=http.csrf()).status == 404
    assert http.act("nonsense", {}, csrf=http.csrf()).status == 404


def test_a_resubmitted_task_keeps_its_own_resume(inproc_stack: Stack, http: Http) -> None:
    agent = {"prompt": "Note {text}", "output_schema": {"type": "object"}, "resume": True}
    DefinitionsTable(inproc_stack.dynamodb, inproc_stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=agent)
    )
    client = AgentqClient.from_env()
    for resume in (False, None):
        old = client.submit("notes", {"text": "x"}, resume=resume)
        client.cancel(old.request_id)
        again = http.act("resubmit", {"requestId": old.request_id, "nonce": http.nonce()},
                         csrf=http.csrf())  # fmt: skip
        fresh = client.get_task(again.json()["requestId"])
        assert fresh.envelope is not None and fresh.envelope.get("resume") is resume
        assert fresh.envelope["input"] == {"text": "x"}


def _operator_actions(client: AgentqClient, request_id: str) -> list[dict[str, Any]]:
    """The task's `Operator Action` rows in the events table (not the bus)."""
    return [e for e in client.events(request_id) if e["detailType"] == "Operator Action"]


def test_a_retried_resubmit_post_makes_one_task(inproc_stack: Stack, http: Http) -> None:
    client = AgentqClient.from_env()
    old = client.submit("noop", {"n": 1})
    client.cancel(old.request_id)
    nonce = http.nonce(f"/tasks/{old.request_id}")
    body = {"requestId": old.request_id, "nonce": nonce}
    # A double click, or the browser sending the POST again after a lost answer.
    first, second = (http.act("resubmit", body, csrf=http.csrf()) for _ in range(2))
    assert first.status == second.status == 200, (first.text, second.text)
    new_id = first.json()["requestId"]
    assert second.json()["requestId"] == new_id != old.request_id
    assert client.get_task(new_id).state is TaskState.PENDING
    assert _queued(inproc_stack).count(new_id) == 1
    # Both requests are on record, each naming the one task.
    recorded = _operator_actions(client, old.request_id)
    assert [e["payload"]["phase"] for e in recorded] == ["requested", "done"] * 2
    assert {e["payload"].get("newRequestId") for e in recorded[1::2]} == {new_id}
    # Another page (another nonce) is another resubmission.
    other = http.act("resubmit", {**body, "nonce": http.nonce()}, csrf=http.csrf())
    assert other.json()["requestId"] not in (new_id, old.request_id)
    # Without the page's nonce, nothing is submitted.
    for bad in (None, "", "short", "x" * 65, "<script>alert(1)</script>", 12345678901234567):
        refused = http.act("resubmit", {**body, "nonce": bad}, csrf=http.csrf())
        assert refused.status == 400, bad
    assert len(_operator_actions(client, old.request_id)) == 6


def test_an_action_that_fails_is_recorded_as_requested_and_failed(
    inproc_stack: Stack, http: Http
) -> None:
    client = AgentqClient.from_env()
    task = client.submit("noop", {})
    client.cancel(task.request_id)
    refused = http.act("cancel", {"requestId": task.request_id}, csrf=http.csrf())
    assert refused.status == 400  # a finished task cannot be cancelled
    requested, done = _operator_actions(client, task.request_id)
    assert requested["payload"]["phase"] == "requested"
    assert requested["payload"]["operator"]["arn"].startswith("arn:aws:")
    assert done["payload"] == {**requested["payload"], "phase": "done", "outcome": "failed",
                               "error": "NotCancellable"}  # fmt: skip
    assert done["timestampMs"] > requested["timestampMs"]


def test_an_action_stays_on_record_when_eventbridge_refuses_its_event(stack: Stack) -> None:
    # On moto's server: in-process moto would also take the calls the faults answer.
    define(stack, "noop")
    client = AgentqClient.from_env()
    task = client.submit("noop", {})
    aws = AwsClients(client.settings.region)
    # Every PutEvents carrying an operator action fails (botocore retries it, then
    # gives up); the task's own events go through.
    faults = FaultInjector(FaultSpec(rules=(FaultRule(
        op="events:PutEvents", kind=Kind.SERVER_ERROR, rate=1.0, match="Operator Action"),)))  # fmt: skip
    install(aws.events, faults)
    parts = build_parts(Settings.from_env(), aws, ConsoleOptions(allow_actions=True))
    with ConsoleServer(parts) as server:
        http = Http(server)
        http.sign_in()
        reply = http.act("cancel", {"requestId": task.request_id}, csrf=http.csrf())
    assert reply.status == 200, reply.text
    assert reply.json()["cancelled"] == [task.request_id]
    assert "EventBridge did not take" in reply.json()["notice"]
    assert faults.counts().get("events:PutEvents:server_error", 0) >= 1
    assert client.get_task(task.request_id).state is TaskState.CANCELLED
    requested, done = _operator_actions(client, task.request_id)
    assert (requested["payload"]["phase"], done["payload"]["phase"]) == ("requested", "done")
    assert done["payload"]["outcome"] == "cancelled"
    assert done["payload"]["actionId"] == requested["payload"]["actionId"]
    # It never reached the bus; the task's own cancellation did.
    log = EventLog(stack)
    assert log.of(task.request_id, "Operator Action") == []
    assert "Task Cancelled" in log.types(task.request_id)
