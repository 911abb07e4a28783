"""Guards around a task: a lost lease, too many receives, ECS scale-in protection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state, store

from agentq.client import AgentqClient
from agentq.events import now_ms
from agentq.local.ecs_agent import EcsAgentStandIn
from agentq.local.stack import LocalStack, LocalStackOptions
from agentq.local.workers import SAMPLE_DEFINITIONS, fast_env
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)


def test_worker_stops_the_child_when_its_lease_is_taken(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    side_log = tmp_path / "runs.jsonl"
    with running_worker(stack) as worker:
        task = send(stack, "sample-sleep", {"seconds": 20, "side_log": str(side_log)})
        events.wait(task.request_id, "Task Processing Started")

        # Another worker takes the task over (as after a long GC pause or a partition),
        # trying again while the worker's own transaction on the item (a renewal) is on.
        def take_over() -> bool:
            try:
                stack.dynamodb.update_item(
                    TableName=stack.resources.table_name,
                    Key={"PK": {"S": f"TASK#{task.tenant}#{task.request_id}"},
                         "SK": {"S": "STATE"}},
                    UpdateExpression="SET leaseToken = :t, effectiveUntil = :eu, #o = :o",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={
                        ":t": {"S": "someone-elses-token"},
                        ":eu": {"N": str(now_ms() + 60_000)},
                        ":o": {"S": "other-worker"},
                    },
                )  # fmt: skip
            except stack.dynamodb.exceptions.TransactionConflictException:
                return False
            return True

        wait_for(take_over, timeout=30, message="the takeover written")
        worker.wait_for_output('"verdict":"lease_lost"', timeout=30)
        worker.stop()
    assert not side_log.exists(), "the child was stopped before it finished"
    assert not events.of(task.request_id, "Task Completed")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.PROCESSING
    assert record.lease_token == "someone-elses-token"
    assert sum(queue_counts(stack)) == 1, "the new holder's message is never deleted"


def test_worker_ends_a_task_received_more_often_than_allowed(stack: Stack) -> None:
    events = EventLog(stack)
    task = send(stack, "sample-echo")
    store(stack).create(task)
    received = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url, WaitTimeSeconds=2)
    handle = received["Messages"][0]["ReceiptHandle"]
    stack.sqs.change_message_visibility(
        QueueUrl=stack.resources.queue_url, ReceiptHandle=handle, VisibilityTimeout=0
    )
    with running_worker(stack, MAX_MESSAGE_RETRIES="1") as worker:
        failed = events.wait(task.request_id, "Task Failed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    assert failed["payload"]["error"]["exception_type"] == "MaxReceivesExceeded"
    assert not events.of(task.request_id, "Task Processing Started")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.FAILED


@pytest.fixture
def ecs_agent() -> Iterator[EcsAgentStandIn]:
    with EcsAgentStandIn() as agent:
        yield agent


def test_worker_protects_its_ecs_task_while_busy(stack: Stack, ecs_agent: EcsAgentStandIn) -> None:
    events = EventLog(stack)
    with running_worker(stack, ECS_AGENT_URI=ecs_agent.uri_for("w1")) as worker:
        task = send(stack, "sample-sleep", {"seconds": 1})
        events.wait(task.request_id, "Task Completed")
        wait_for(lambda: len(ecs_agent.puts("w1")) >= 2, message="protection on and off")
        worker.stop()
    calls = ecs_agent.puts("w1")
    assert calls[0]["ProtectionEnabled"] is True
    assert calls[0]["ExpiresInMinutes"] > 0
    assert calls[1] == {"ProtectionEnabled": False}
    assert not ecs_agent.protected("w1")


def test_worker_retries_a_protection_change_the_agent_refused(
    stack: Stack, ecs_agent: EcsAgentStandIn
) -> None:
    """The agent's `failure` reply is read: the change is tried again until it takes."""
    events = EventLog(stack)
    ecs_agent.fail_next("w1", 2, "failure")
    with running_worker(stack, ECS_AGENT_URI=ecs_agent.uri_for("w1")) as worker:
        task = send(stack, "sample-sleep", {"seconds": 6})
        events.wait(task.request_id, "Task Processing Started")
        wait_for(lambda: ecs_agent.protected("w1"), timeout=20, message="protection took")
        events.wait(task.request_id, "Task Completed")
        wait_for(lambda: not ecs_agent.protected("w1"), message="protection off when idle")
        worker.stop()
    enabling = [c for c in ecs_agent.puts("w1") if c["ProtectionEnabled"]]
    assert len(enabling) >= 3, "two refusals, then the change that took"
    refusals = [
        r for r in worker.log_records() if "protection update refused" in str(r.get("message"))
    ]
    assert len(refusals) == 1, "one warning per outage, not one per retry"
    assert "TASK_NOT_VALID" in refusals[0]["detail"]


def test_a_worker_protected_past_its_maximum_retires_without_killing_its_task(
    stack: Stack, ecs_agent: EcsAgentStandIn
) -> None:
    """Under steady load protection would never drop and a deploy would wait forever:
    past PROTECTION_MAX_AGE the worker starts nothing new, finishes what runs, exits."""
    events = EventLog(stack)
    with running_worker(
        stack, ECS_AGENT_URI=ecs_agent.uri_for("w1"), PROTECTION_MAX_AGE="2000"
    ) as worker:
        task = send(stack, "sample-sleep", {"seconds": 6})
        events.wait(task.request_id, "Task Processing Started")
        worker.wait_for_output("retiring", timeout=30)
        later = send(stack, "sample-echo")
        assert worker.wait(timeout=60) == 0
    assert events.of(task.request_id, "Task Completed"), "the running task finished"
    assert not events.of(later.request_id, "Task Processing Started")
    assert not ecs_agent.protected("w1"), "protection dropped before the worker left"
    assert sum(queue_counts(stack)) == 1, "the later task waits for another worker"


def test_worker_fails_a_task_whose_attempts_are_used_up(stack: Stack) -> None:
    events = EventLog(stack)
    task = send(stack, "sample-echo")
    store(stack).create(task)
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": f"TASK#{task.tenant}#{task.request_id}"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET #s = :s, attempt = :a",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "RETRYING"}, ":a": {"N": "3"}},
    )
    with running_worker(stack) as worker:
        failed = events.wait(task.request_id, "Task Failed")[0]
        wait_for(lambda: queue_counts(stack) == (0, 0), message="message deleted")
        worker.stop()
    assert failed["payload"]["reason"] == "attempts exhausted"
    assert not events.of(task.request_id, "Task Processing Started")
    record = state(stack, task)
    assert record is not None and record.state is TaskState.FAILED and record.attempt == 3


def test_local_stack_workers_protect_themselves_on_its_ecs_agent(tmp_path: Path) -> None:
    """`agentq local up` gives each worker an ECS_AGENT_URI on the stand-in."""
    options = LocalStackOptions(stage="protect", workers=1, definitions_dirs=(SAMPLE_DEFINITIONS,),
                                health_interval_s=0, worker_env=fast_env(), work_dir=tmp_path)  # fmt: skip
    with LocalStack(options) as local:
        agent = local.ecs_agent
        assert agent is not None
        client = AgentqClient.from_env()
        record = client.submit("sample-sleep", {"seconds": 3})
        wait_for(lambda: agent.protected("worker-1"), timeout=60, message="protected while busy")
        done = client.wait(request_id=record.request_id, timeout_s=60, poll_s=0.2)
        assert done.state is TaskState.COMPLETED
        wait_for(lambda: not agent.protected("worker-1"), timeout=30, message="off when idle")
