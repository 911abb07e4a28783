"""Priority tiers through real queues (moto) and real workers: the scheduler's modes."""

from __future__ import annotations

import json

import pytest
from conftest import Stack
from support import EventLog, logged_ms, wait_for
from worker_support import new_id, queue_counts, running_worker

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import TaskEnvelope
from agentq.errors import InvalidInput
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import TaskStore
from worker.sqs.batcher import SqsBatcher


def send_to(stack: Stack, tier: str, count: int, seconds: float) -> list[TaskEnvelope]:
    """`count` sample-sleep tasks on `tier`'s queue, in batched sends."""
    envelopes = [
        TaskEnvelope(request_id=new_id(tier), tenant="acme", definition="sample-sleep",
                     input={"seconds": seconds}, priority=tier)
        for _ in range(count)
    ]  # fmt: skip
    for start in range(0, count, 10):
        stack.sqs.send_message_batch(
            QueueUrl=stack.resources.tier_queues[tier],
            Entries=[{"Id": str(n), "MessageBody": e.to_body(),
                      "MessageAttributes": e.message_attributes()}
                     for n, e in enumerate(envelopes[start : start + 10])],
        )  # fmt: skip
    return envelopes


def started_at(events: EventLog, envelopes: list[TaskEnvelope]) -> dict[str, int]:
    """Request id → when its (first) attempt started, for those that started."""
    found: dict[str, int] = {}
    for envelope in envelopes:
        starts = events.of(envelope.request_id, "Task Processing Started")
        if starts:
            found[envelope.request_id] = min(int(e["timestampMs"]) for e in starts)
    return found


def completed(events: EventLog, envelopes: list[TaskEnvelope]) -> bool:
    return all(events.of(e.request_id, "Task Completed") for e in envelopes)


def test_strict_starts_high_tasks_that_arrive_during_a_low_flood_before_the_rest_of_it(
    stack: Stack,
) -> None:
    events = EventLog(stack)
    # A second a low task: the flood lasts 10 s on two slots, longer than the stored
    # events may lag on a loaded host (the test sees starts through them).
    lows = send_to(stack, "low", 20, 1.0)
    with running_worker(
        stack, MAX_CONCURRENT_CLAUDE="2", SCHEDULER_MODE="strict", SCHEDULER_PROBE_INTERVAL="200"
    ) as worker:
        wait_for(lambda: len(started_at(events, lows)) >= 3, timeout=90, message="flood started")
        sent_ms = now_ms()
        highs = send_to(stack, "high", 3, 0.3)
        wait_for(lambda: completed(events, highs), timeout=60, message="high tasks done")
        last_high = max(started_at(events, highs).values())
        low_starts = started_at(events, lows)
        overtaken = [at for at in low_starts.values() if sent_ms < at <= last_high]
        # Already running or prefetched when the highs arrived: at most slots + prefetch.
        assert len(overtaken) <= 4, overtaken
        wait_for(lambda: completed(events, lows), timeout=90, message="the flood drained")
        later = [at for at in started_at(events, lows).values() if at > last_high]
        assert later, "the rest of the flood waited for the highs"
        worker.stop()
        stats = worker.stats()
    assert stats is not None
    scheduler = stats["scheduler"]
    assert scheduler["mode"] == "strict" and scheduler["picks"]["high"] >= 1
    # Backlog comes from receives; the attributes call is periodic, never per receive
    # (one per tier and refresh, plus the start-up check that the queue exists).
    attribute_calls = stats["awsCalls"].get("sqs:GetQueueAttributes", 0)
    assert attribute_calls <= 3 * scheduler["backlogRefreshes"] + 1
    assert scheduler["backlogRefreshes"] < scheduler["receives"]


def test_a_high_task_sent_while_every_slot_is_busy_takes_the_next_slot_that_frees(
    stack: Stack,
) -> None:
    events = EventLog(stack)
    lows = send_to(stack, "low", 24, 0.4)
    # The default probe interval (1 s): the watched high tier's own long poll, not a
    # probe, must find the task, or about five low tasks would start before it here.
    with running_worker(stack, MAX_CONCURRENT_CLAUDE="2", SCHEDULER_MODE="weighted") as worker:
        wait_for(lambda: len(started_at(events, lows)) >= 4, timeout=90, message="flood started")
        sent_ms = now_ms()
        (high,) = send_to(stack, "high", 1, 0.1)
        wait_for(lambda: completed(events, [high]), timeout=60, message="the high task ran")
        high_start = started_at(events, [high])[high.request_id]
        # From when the worker had it in hand (a loaded host once took long enough to
        # receive it that three 0.4 s tasks started meanwhile): at most the hand-overs
        # racing its receive start before it. How it was found: the stats below.
        received_ms = min(logged_ms(r) for r in worker.log_records()
                          if r.get("message") == "message received"
                          and r.get("requestId") == high.request_id)  # fmt: skip
        assert sent_ms <= received_ms + 50  # a receive after the send (clock rounding)
        overtaken = [at for at in started_at(events, lows).values()
                     if received_ms < at < high_start]  # fmt: skip
        assert len(overtaken) <= 2, (received_ms, high_start, overtaken)
        wait_for(lambda: completed(events, lows), timeout=120, message="the flood drained")
        worker.stop()
        stats = worker.stats()
    assert stats is not None
    scheduler = stats["scheduler"]
    # The watcher found it; the receive loop picks the watched tier only for a backlog it
    # believes waits there: a belief the watcher's receive made stale costs an empty pick,
    # two on a loaded host (a CI run), never one a probe interval through the flood.
    assert scheduler["watchReceives"] >= 1 and scheduler["picks"]["high"] <= 2, scheduler
    # A drained tier is probed with back-off, and no refresh asks a tier being received.
    assert scheduler["emptyReceives"] < scheduler["receives"] / 2, scheduler


def preload(stack: Stack) -> tuple[list[TaskEnvelope], list[TaskEnvelope]]:
    return send_to(stack, "high", 6, 0.4), send_to(stack, "low", 3, 0.1)


def test_strict_runs_every_waiting_high_task_before_any_low_one(stack: Stack) -> None:
    events = EventLog(stack)
    highs, lows = preload(stack)
    with running_worker(
        stack, MAX_CONCURRENT_CLAUDE="1", PREFETCH_HORIZON="0", SCHEDULER_MODE="strict"
    ):
        wait_for(lambda: completed(events, highs + lows), timeout=120, message="all done")
    assert max(started_at(events, highs).values()) < min(started_at(events, lows).values())


def test_weighted_lets_a_low_task_in_once_its_tier_waited_past_the_bound(stack: Stack) -> None:
    events = EventLog(stack)
    highs, lows = preload(stack)
    with running_worker(
        stack,
        MAX_CONCURRENT_CLAUDE="1",
        PREFETCH_HORIZON="0",
        SCHEDULER_MODE="weighted",
        SCHEDULER_STARVATION_BOUND="1000",
    ):
        wait_for(lambda: completed(events, highs + lows), timeout=120, message="all done")
    high_starts = sorted(started_at(events, highs).values())
    low_starts = sorted(started_at(events, lows).values())
    # The score alone would drain the highs first (10^4 against 10^2); the bound does not
    # let the low tier wait for all of them.
    assert low_starts[0] < high_starts[-1]
    assert high_starts[0] < low_starts[0], "the high tier still goes first"


def test_a_message_on_the_wrong_tier_is_forwarded_to_its_own(stack: Stack) -> None:
    events = EventLog(stack)
    envelope = TaskEnvelope(request_id=new_id(), tenant="acme", definition="sample-noop")
    # A `Task Requested` event as the bus delivers it: onto the default tier's queue.
    body = {"detail-type": "Task Requested", "source": "billing",
            "detail": {**envelope.to_dict(), "priority": "high"}}  # fmt: skip
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=json.dumps(body))
    with running_worker(stack) as worker:
        wait_for(
            lambda: events.of(envelope.request_id, "Task Completed"),
            timeout=60,
            message="the forwarded task ran",
        )
        worker.stop()
        stats = worker.stats()
    assert stats is not None
    assert stats["verdicts"].get("forwarded") == 1
    assert stats["scheduler"]["forwarded"] == 1


@pytest.mark.timeout(120)
def test_an_unconfigured_tier_is_refused_at_receive_and_at_submit(stack: Stack) -> None:
    """`urgent` is no tier here: a message naming it (a foreign sender, a `Task
    Requested` event) is recorded failed as validation and removed, never run under
    that name on the queue it arrived on; the client refuses it before sending."""
    events = EventLog(stack)
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    plain, event_sent = (TaskEnvelope(request_id=new_id(), tenant="acme",
                                      definition="sample-noop", priority="urgent")
                         for _ in range(2))  # fmt: skip
    tasks.create(plain)  # a producer that wrote its STATE item before sending
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=plain.to_body(),
                           MessageAttributes=plain.message_attributes())  # fmt: skip
    body = {"detail-type": "Task Requested", "source": "billing",
            "detail": event_sent.to_dict()}  # fmt: skip
    stack.sqs.send_message(QueueUrl=stack.resources.queue_url, MessageBody=json.dumps(body))
    with running_worker(stack) as worker:
        failed = [events.wait(e.request_id, "Task Failed")[0] for e in (plain, event_sent)]
        wait_for(lambda: queue_counts(stack) == (0, 0), timeout=20,
                 message="both messages removed")  # fmt: skip
        worker.stop()
    for event in failed:
        assert event["payload"]["error"]["category"] == "validation"
        assert "unknown priority 'urgent'" in event["payload"]["error"]["message"]
    record = tasks.require("acme", plain.request_id)
    assert record.state is TaskState.FAILED and record.attempt == 0
    for envelope in (plain, event_sent):
        assert not events.of(envelope.request_id, "Task Processing Started")

    settings = Settings.from_env(stack.env())
    client = AgentqClient(settings=settings, sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=stack.events, s3=stack.s3)  # fmt: skip
    with pytest.raises(InvalidInput, match="unknown priority 'urgent'") as refused:
        client.submit("sample-noop", priority="urgent")
    assert refused.value.field == "priority"
    assert [queue_counts(stack, url) for url in set(stack.resources.tier_queues.values())] == [
        (0, 0)] * len(set(stack.resources.tier_queues.values()))  # fmt: skip


def test_the_client_sends_each_task_to_its_tier_queue(stack: Stack) -> None:
    settings = Settings.from_env(stack.env())
    client = AgentqClient(settings=settings, sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=stack.events, s3=stack.s3)  # fmt: skip
    client.submit("sample-noop", priority="high")
    client.submit("sample-noop", priority="low")
    client.submit("sample-noop", priority="low")
    client.submit("sample-noop")
    tiers = stack.resources.tier_queues
    assert queue_counts(stack, tiers["high"])[0] == 1
    assert queue_counts(stack, tiers["low"])[0] == 2
    assert queue_counts(stack, tiers["normal"])[0] == 1
    assert tiers["normal"] == stack.resources.queue_url, "the default tier is the task queue"


def test_a_job_sends_each_task_to_its_own_tier_else_the_jobs_else_the_definitions(
    stack: Stack,
) -> None:
    settings = Settings.from_env(stack.env())
    registry = DefinitionRegistry(
        directory_definitions={
            "bulk": TaskDefinition.from_dict(
                {
                    "name": "bulk",
                    "kind": "python",
                    "priority": "low",
                    "settings": {"callable": "agentq.samples:noop"},
                }
            ),
        }
    )
    client = AgentqClient(settings=settings, sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=stack.events, s3=stack.s3, definitions=registry)  # fmt: skip
    client.create_job({"priority": "high", "tasks": {
        "urgent": {"definition": "bulk"},                      # the job's: high
        "own": {"definition": "bulk", "priority": "normal"},   # its own: normal
    }})  # fmt: skip
    client.create_job({"tasks": {"plain": {"definition": "bulk"}}})  # the definition's: low
    tiers = stack.resources.tier_queues
    assert [queue_counts(stack, tiers[t])[0] for t in ("high", "normal", "low")] == [1, 1, 1]
    with pytest.raises(InvalidInput) as caught:
        client.create_job({"tasks": {"x": {"definition": "bulk", "priority": "urgent"}}})
    assert caught.value.field == "tasks.x.priority"


def test_every_send_carries_its_tenant_as_message_group_and_copies_keep_it(
    stack: Stack,
) -> None:
    settings = Settings.from_env(stack.env())
    client = AgentqClient(settings=settings, sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=stack.events, s3=stack.s3)  # fmt: skip
    client.submit("sample-noop", tenant="tenant-b", priority="high")
    high = stack.resources.tier_queues["high"]
    received = stack.sqs.receive_message(
        QueueUrl=high, MessageSystemAttributeNames=["MessageGroupId"],
        MessageAttributeNames=["All"],
    )["Messages"]  # fmt: skip
    assert received[0]["Attributes"]["MessageGroupId"] == "tenant-b"
    # The worker's copies (a requeued back-off, a forward to another tier) keep it.
    batcher = SqsBatcher(stack.sqs, stack.resources.queue_url, delay_s=0)
    batcher.routes.note(received[0]["ReceiptHandle"], high)
    batcher.forward(received[0], stack.resources.tier_queues["low"]).wait(10)
    batcher.close()
    copy = stack.sqs.receive_message(
        QueueUrl=stack.resources.tier_queues["low"], MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert copy[0]["Attributes"]["MessageGroupId"] == "tenant-b"
    assert queue_counts(stack, high) == (0, 0), "the original was deleted"
