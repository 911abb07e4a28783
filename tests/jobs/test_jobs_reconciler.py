"""The reconciler repairs what no event fixes, once, and leaves healthy work alone.

Each broken situation is made for real against moto's server: a message drained from
the queue (lost), a lease run out with its message gone, a terminal task whose event
never reached the dispatcher. Bounds are set to a second and passed for real.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack
from jobs_support import bus_events, client_for, drain, eventbridge, finish, of_type, start
from support import settle_indexes, wait_for

from agentq.aws import make_client, new_session
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope, parse_message
from agentq.events import Event, now_ms
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.jobs import JobDispatcher, task_request_id
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION
from agentq.local.lambda_host import LambdaHost, local_context, scheduled_event
from agentq.reconcile import Reconciler
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore
from lambdas import health_check, reconciler, save_event

pytestmark = pytest.mark.timeout(120)

CHAIN: dict[str, Any] = {
    "tasks": {
        "A": {"definition": "noop", "input": {"n": 1}},
        "B": {"definition": "summarize", "input": {"from_a": "${tasks.A.result}"}},
    }
}


def build(client: AgentqClient, stack: Stack, *, lost_after: int, stall_after: int) -> Reconciler:
    settings = Settings.from_env().model_copy(
        update={"reconcile_lost_after_s": lost_after, "reconcile_stall_after_s": stall_after}
    )
    return Reconciler(settings=settings, tasks=client.tasks, jobs=client.jobs,
                      dispatcher=client.dispatcher, publisher=client.publisher,
                      dynamodb=stack.dynamodb, sqs=stack.sqs)  # fmt: skip


def envelope_of(record: TaskRecord) -> TaskEnvelope:
    assert record.envelope is not None
    return TaskEnvelope.from_dict(record.envelope, default_tenant=record.tenant)


def submitted(client: AgentqClient, name: str) -> TaskRecord:
    return client.submit("noop", {"name": name}, idempotency_key=name)


def pass_bound(seconds: float) -> None:
    """Let real time pass the reconciler's bound (what the situation needs to be 'lost')."""
    until = now_ms() + int(seconds * 1000)
    wait_for(lambda: now_ms() > until, timeout=seconds + 10, message="the bound to pass")


def sent_ids(stack: Stack) -> list[str]:
    return sorted(str(body["requestId"]) for body in drain(stack))


def test_lost_messages_are_sent_again_once_and_healthy_tasks_are_left_alone(
    stack: Stack,
) -> None:
    client = client_for(stack)
    tasks = client.tasks
    pending = submitted(client, "lost-pending")
    retrying = submitted(client, "lost-retrying")
    lapsed = submitted(client, "lost-lease")
    drain(stack)  # the three messages are lost
    lease = tasks.acquire(envelope_of(retrying), worker_id="w1", lease_seconds=60, max_attempts=3)
    tasks.finalize(lease, TaskState.RETRYING, retry_at_ms=now_ms())
    tasks.acquire(envelope_of(lapsed), worker_id="w-dead", lease_seconds=0.05, max_attempts=3)
    pass_bound(1.2)
    # The sweeps run as of now: what is created from here on is younger than the bound
    # however slowly this test goes on.
    at = now_ms()
    # Healthy: fresh, running with a live lease, retrying later, finished.
    fresh = submitted(client, "fresh")
    running = submitted(client, "running")
    later = submitted(client, "retry-later")
    done = submitted(client, "done")
    drain(stack)
    tasks.acquire(envelope_of(running), worker_id="w2", lease_seconds=600, max_attempts=3)
    lease = tasks.acquire(envelope_of(later), worker_id="w2", lease_seconds=60, max_attempts=3)
    tasks.finalize(lease, TaskState.RETRYING, retry_at_ms=now_ms() + 600_000)
    lease = tasks.acquire(envelope_of(done), worker_id="w2", lease_seconds=60, max_attempts=3)
    tasks.finalize(lease, TaskState.COMPLETED)
    bus_events(stack)
    sweeper = build(client, stack, lost_after=1, stall_after=60)

    first = sweeper.run(at_ms=at)
    resent = drain(stack)
    second = sweeper.run(at_ms=at)

    assert not first.errors
    by_kind = {r.kind: r.subject for r in first.repairs}
    assert by_kind == {"pending_lost": pending.request_id,
                       "retrying_lost": retrying.request_id,
                       "lease_lapsed": lapsed.request_id}  # fmt: skip
    assert sorted(str(b["requestId"]) for b in resent) == sorted(by_kind.values())
    for body in resent:  # a worker can take each copy like the original
        attributes = {k: {"DataType": "String", "StringValue": v}
                      for k, v in body.pop("_attributes").items()}  # fmt: skip
        parsed = parse_message(json.dumps(body), attributes, default_tenant="default")
        assert parsed == envelope_of(tasks.require("default", parsed.request_id))
    repaired = of_type(bus_events(stack), "Task Repaired")
    assert sorted(e["detail"]["requestId"] for e in repaired) == sorted(by_kind.values())
    assert {e["detail"]["payload"]["repair"] for e in repaired} == set(by_kind)
    assert second.repairs == [] and sent_ids(stack) == []
    for rid in by_kind.values():
        assert tasks.require("default", rid).raw["repairs"] == 1
    for healthy in (fresh, running, later, done):
        assert "repairedAt" not in tasks.require("default", healthy.request_id).raw
    # The re-sent lapsed task is taken over like any expired lease.
    takeover = tasks.acquire(envelope_of(lapsed), worker_id="w3", lease_seconds=60, max_attempts=3)
    assert takeover.attempt == 2


def test_a_task_repaired_within_the_bound_waits_then_is_repaired_again(stack: Stack) -> None:
    client = client_for(stack)
    lost = submitted(client, "lost-twice")
    drain(stack)
    pass_bound(1.2)
    sweeper = build(client, stack, lost_after=1, stall_after=60)
    at = now_ms()
    assert [r.subject for r in sweeper.run(at_ms=at).repairs] == [lost.request_id]
    drain(stack)  # the re-sent copy is lost as well

    # Within the bound that copy gets its chance; past it, it is lost too.
    assert sweeper.run(at_ms=at + 900).repairs == []
    assert [r.subject for r in sweeper.run(at_ms=at + 1100).repairs] == [lost.request_id]
    assert client.tasks.require("default", lost.request_id).raw["repairs"] == 2


def test_a_job_whose_events_were_lost_is_moved_on_and_closed_once(stack: Stack) -> None:
    client = client_for(stack)
    client.create_job(CHAIN, job_id="stalled")
    client.create_job(CHAIN, job_id="healthy")
    drain(stack)
    start(stack, "healthy", "A")  # running: the job is waiting, not stalled
    finish(stack, "stalled", "A", result={"value": 7})  # its Task Completed never arrives
    pass_bound(1.2)
    settle_indexes(stack)  # the sweeper finds jobs through the status index
    bus_events(stack)
    sweeper = build(client, stack, lost_after=60, stall_after=1)

    first = sweeper.run()
    [sent] = drain(stack)
    again = sweeper.run()

    assert [(r.kind, r.subject) for r in first.repairs] == [("job_stalled", "stalled")]
    assert sent["taskKey"] == "B" and sent["input"] == {"from_a": {"value": 7}}
    assert again.repairs == [] and drain(stack) == []
    events = bus_events(stack)
    [record] = of_type(events, "Job Repaired")
    assert record["detail"]["jobId"] == "stalled"
    assert record["detail"]["payload"]["outcome"]["enqueued"] == ["B"]
    healthy = client.jobs.require("default", "healthy")
    assert healthy.state == "RUNNING" and healthy.done == 0
    b_state = client.tasks.require("default", task_request_id("healthy", "B")).state
    assert b_state is TaskState.BLOCKED

    finish(stack, "stalled", "B")  # and this event is lost too
    pass_bound(1.2)
    settle_indexes(stack)  # the sweeper finds jobs through the status index
    closing = sweeper.run()
    closed_again = sweeper.run()

    assert [r.subject for r in closing.repairs] == ["stalled"]
    assert closed_again.repairs == []
    job = client.jobs.require("default", "stalled")
    assert job.state == "COMPLETED" and job.done == 2
    assert "statusPK" not in job.raw  # a closed job leaves the index
    events = bus_events(stack)
    assert len(of_type(events, "Job Completed")) == 1
    assert len(of_type(events, "Job Repaired")) == 1
    settle_indexes(stack)  # the closed job leaves the status index a moment later
    assert [j for _, j in sweeper.jobs.running_jobs(created_before_ms=now_ms())] == ["healthy"]


def test_a_job_that_breaks_the_dispatcher_does_not_stop_the_others(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_for(stack)
    for job_id in ("broken", "stalled"):
        client.create_job(CHAIN, job_id=job_id)
    drain(stack)
    for job_id in ("broken", "stalled"):
        finish(stack, job_id, "A", result={"value": 7})  # their Task Completed never arrives
    resolve = JobDispatcher.resolve_input

    def breaks_on_one_job(self: JobDispatcher, spec: Any, task: Any, states: Any) -> Any:
        if any(r is not None and r.request_id.startswith("broken-") for r in states.values()):
            raise ValueError("a defect no one foresaw")
        return resolve(self, spec, task, states)

    monkeypatch.setattr(JobDispatcher, "resolve_input", breaks_on_one_job)
    pass_bound(1.2)
    result = build(client, stack, lost_after=60, stall_after=1).run()

    assert [r.subject for r in result.repairs] == ["stalled"]
    assert [sent["jobId"] for sent in drain(stack)] == ["stalled"]
    assert any("job broken: ValueError" in error for error in result.errors), result.errors


def test_a_lost_failure_still_applies_the_failure_policy(stack: Stack) -> None:
    client = client_for(stack)
    client.create_job({**CHAIN, "failure_policy": "fail_fast"}, job_id="failing")
    drain(stack)
    finish(stack, "failing", "A", TaskState.FAILED)
    pass_bound(1.2)

    report = build(client, stack, lost_after=60, stall_after=1).run()

    assert [r.subject for r in report.repairs] == ["failing"]
    b = client.tasks.require("default", task_request_id("failing", "B"))
    assert b.state is TaskState.CANCELLED
    assert client.jobs.require("default", "failing").state == "FAILED"
    assert drain(stack) == []


def test_the_lambda_counts_repairs_and_the_health_check_alerts_on_them(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RECONCILE_LOST_AFTER", "1")
    client = client_for(stack)
    lost = submitted(client, "lost-for-alert")
    drain(stack)
    pass_bound(1.2)
    bus_events(stack)
    capsys.readouterr()

    result = reconciler.handler(scheduled_event("test"), local_context("reconciler"))

    assert result["counts"] == {"pending_lost": 1}
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{") and "_aws" in line]  # fmt: skip
    [metrics] = [m for m in emf if "Repairs" in m]
    # Powertools writes each metric's values as a list.
    assert metrics["Repairs"] == [1.0] and metrics["Repairs_pending_lost"] == [1.0]
    assert metrics["Repairs_job_stalled"] == [0.0]
    for envelope in bus_events(stack):  # what save-event does with every bus event
        event = Event.from_detail(envelope["detail"], envelope["detail-type"])
        save_event.handler(eventbridge(event), local_context("save-event"))
    settle_indexes(stack)  # the health check finds repairs through the byType index

    first = health_check.handler(scheduled_event("test"), local_context("health-check"))
    second = health_check.handler(scheduled_event("test"), local_context("health-check"))

    assert f"repaired:{lost.request_id}" in first["alerted"]
    assert first["findings"].get("repaired") == 1
    assert second["alerted"] == []


def test_the_local_host_runs_the_reconciler_on_its_timer(stack: Stack) -> None:
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                    reconcile_interval_s=0.2, serve_dlq=False) as host:  # fmt: skip
        wait_for(lambda: host.invocations["reconciler"] >= 2, timeout=30,
                 message="two reconciler runs")  # fmt: skip
    assert host.errors["reconciler"] == 0


def _faulty(stack: Stack, service: str, *rules: FaultRule) -> Any:
    """A client built the way agentq builds them, with these faults installed."""
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    client = make_client(session, service, endpoint_url=stack.resources.endpoint_for(service))
    return install(client, FaultInjector(FaultSpec(rules=rules), seed=3))


def test_a_claim_applied_then_retried_is_still_the_reconcilers_own(stack: Stack) -> None:
    client = client_for(stack)
    lost = submitted(client, "claim-retried")
    drain(stack)
    pass_bound(1.2)
    # The claim reaches DynamoDB, its answer is lost, botocore sends it again and the
    # retry meets its own claim as a failed condition.
    ddb = _faulty(stack, "dynamodb", FaultRule(op="dynamodb:UpdateItem",
                  kind=Kind.APPLIED_THEN_FAILED, rate=1.0, limit=1, match="repairToken"))  # fmt: skip
    sweeper = Reconciler(
        settings=Settings.from_env().model_copy(update={"reconcile_lost_after_s": 1}),
        tasks=TaskStore(ddb, stack.resources.table_name), jobs=client.jobs,
        dispatcher=client.dispatcher, publisher=client.publisher, dynamodb=ddb, sqs=stack.sqs,
    )  # fmt: skip

    report = sweeper.run()

    assert [r.subject for r in report.repairs] == [lost.request_id], report.errors
    assert sent_ids(stack) == [lost.request_id]
    assert client.tasks.require("default", lost.request_id).raw["repairs"] == 1


def test_a_failed_send_or_a_conflicting_claim_leaves_the_repair_to_the_next_run(
    stack: Stack,
) -> None:
    client = client_for(stack)
    lost = submitted(client, "send-fails")
    drain(stack)
    pass_bound(1.2)
    settings = Settings.from_env().model_copy(update={"reconcile_lost_after_s": 1})

    def sweeper(ddb: Any, sqs: Any) -> Reconciler:
        return Reconciler(settings=settings, tasks=TaskStore(ddb, stack.resources.table_name),
                          jobs=client.jobs, dispatcher=client.dispatcher,
                          publisher=client.publisher, dynamodb=ddb, sqs=sqs)  # fmt: skip

    # Every attempt of the send fails (botocore gives up): the claim is given back.
    failing_sqs = _faulty(stack, "sqs", FaultRule(op="sqs:SendMessage",
                          kind=Kind.SERVER_ERROR, rate=1.0))  # fmt: skip
    unsent = sweeper(stack.dynamodb, failing_sqs).run()
    settle_indexes(stack)  # its claim, given back, shows in the status index again
    # A transaction conflict on the claim (botocore does not retry it): nothing claimed.
    conflicted_ddb = _faulty(stack, "dynamodb", FaultRule(op="dynamodb:UpdateItem",
                             kind=Kind.TRANSACTION_CONFLICT, rate=1.0, match="repairToken"))  # fmt: skip
    conflicted = sweeper(conflicted_ddb, stack.sqs).run()
    settle_indexes(stack)
    healthy = sweeper(stack.dynamodb, stack.sqs).run()

    assert unsent.repairs == [] and len(unsent.errors) == 1
    assert conflicted.repairs == [] and "TransactionConflict" in conflicted.errors[0]
    assert [r.subject for r in healthy.repairs] == [lost.request_id]  # no bound to wait
    assert sent_ids(stack) == [lost.request_id]
    assert client.tasks.require("default", lost.request_id).raw["repairs"] == 1
