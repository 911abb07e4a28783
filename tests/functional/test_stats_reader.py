"""agentq.stats on AWS's side: the oldest message ages from SQS's CloudWatch metric, in
one `GetMetricData`, and the reads counted (moto, in process)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from conftest import Stack

from agentq import stats
from agentq.aws import CallCounter
from agentq.config import Settings
from agentq.events import task_event
from agentq.stats import StatsReader
from agentq.store import EventStore
from agentq.store.workers import ANNOUNCE_EVERY_MS, GONE_AFTER_MS, RosterAnnouncer, WorkerRoster


def _queue_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def test_on_aws_the_oldest_ages_come_from_one_get_metric_data(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTQ_LOCAL", raising=False)
    env = {k: v for k, v in inproc_stack.env().items() if k != "AGENTQ_LOCAL"}
    settings = Settings.from_env(env)
    assert not settings.local
    counter = CallCounter()
    cloudwatch = counter.attach(inproc_stack.aws_clients().get("cloudwatch"))
    high = inproc_stack.resources.tier_queues["high"]
    cloudwatch.put_metric_data(
        Namespace="AWS/SQS",
        MetricData=[
            {
                "MetricName": "ApproximateAgeOfOldestMessage",
                "Dimensions": [{"Name": "QueueName", "Value": _queue_name(high)}],
                "Timestamp": datetime.now(UTC),
                "Value": 42.0,
            }
        ],
    )
    before = counter.total()
    reader = StatsReader(
        settings,
        sqs=counter.attach(inproc_stack.sqs),
        dynamodb=counter.attach(inproc_stack.dynamodb),
        cloudwatch=cloudwatch,
    )
    data = reader.read(900)
    tiers = {row["tier"]: row for row in data["tiers"]}
    assert tiers["high"]["oldestAgeS"] == 42.0 and tiers["high"]["ageSource"] == "cloudwatch"
    assert tiers["low"]["oldestAgeS"] is None, "a queue with no datapoint has no age"
    assert data["dlq"]["oldestAgeS"] is None
    snapshot = counter.snapshot()
    assert snapshot["cloudwatch:GetMetricData"] == 1
    assert counter.total() - before == data["requests"] == 19  # and the roster query


def test_a_long_read_stops_at_its_page_cap_and_says_so(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env(inproc_stack.env())
    store = EventStore(inproc_stack.dynamodb, inproc_stack.resources.table_name,
                       app_name=settings.app_name)  # fmt: skip
    for n in range(9):
        store.append(task_event("Task Completed", request_id=f"r-{n}", tenant="acme",
                                priority="high", duration_ms=10 * n))  # fmt: skip
    monkeypatch.setattr(stats, "MAX_PAGES", 2)
    counter = CallCounter()
    reader = StatsReader(settings, sqs=counter.attach(inproc_stack.sqs),
                         dynamodb=counter.attach(inproc_stack.dynamodb), page_size=3)  # fmt: skip
    data = reader.read(900)
    high = data["tiers"][0]
    assert data["truncated"] is True
    assert high["completions"] == 6, "two pages of three: a lower bound, not the 9 stored"
    # 4 queue reads, 2 pages of completions, 4 other event types, 8 status shards once, the
    # roster.
    assert counter.total() == data["requests"] == 4 + 2 + 4 + 8 + 1
    whole = StatsReader(settings, sqs=inproc_stack.sqs, dynamodb=inproc_stack.dynamodb,
                        page_size=100).read(900)  # fmt: skip
    assert whole["truncated"] is False and whole["tiers"][0]["completions"] == 9
    assert whole["tiers"][0]["processingMs"] == {"count": 9, "p50": 40, "p95": 80}


def test_idle_and_gone_workers_are_seen_through_the_roster(inproc_stack: Stack) -> None:
    settings = Settings.from_env(inproc_stack.env())
    roster = WorkerRoster(inproc_stack.dynamodb, inproc_stack.resources.table_name)
    now = 10_000_000
    clock = {"ms": now}
    idle = RosterAnnouncer(roster, worker="w-idle", slots=4, busy=lambda: 0, version="1.2.3",
                           clock_ms=lambda: clock["ms"])  # fmt: skip
    idle.tick()
    clock["ms"] = now - GONE_AFTER_MS - 1_000
    gone = RosterAnnouncer(roster, worker="w-gone", slots=2, busy=lambda: 1, version="1.2.3",
                           clock_ms=lambda: clock["ms"])  # fmt: skip
    gone.tick()
    done = RosterAnnouncer(roster, worker="w-done", slots=2, busy=lambda: 0, version="1.2.3",
                           clock_ms=lambda: now)  # fmt: skip
    done.stopped()
    data = StatsReader(settings, sqs=inproc_stack.sqs, dynamodb=inproc_stack.dynamodb).read(
        900, at_ms=now
    )
    consumers = data["consumers"]
    by_name = {w["worker"]: w for w in consumers["list"]}
    assert set(by_name) == {"w-idle", "w-gone"}, "a cleanly stopped worker with no task is left out"
    assert (by_name["w-idle"]["status"], by_name["w-idle"]["slots"]) == ("idle", 4)
    assert by_name["w-idle"]["version"] == "1.2.3"
    assert by_name["w-gone"]["status"] == "gone"
    assert (consumers["workers"], consumers["idle"], consumers["gone"], consumers["slots"]) == (
        1,
        1,
        1,
        4,
    )


def test_the_announcer_writes_at_most_every_interval(inproc_stack: Stack) -> None:
    counter = CallCounter()
    roster = WorkerRoster(counter.attach(inproc_stack.dynamodb), inproc_stack.resources.table_name)
    clock = {"ms": 0}
    announcer = RosterAnnouncer(roster, worker="w", slots=1, busy=lambda: 0, version="v",
                                clock_ms=lambda: clock["ms"])  # fmt: skip
    for step in range(0, ANNOUNCE_EVERY_MS * 3, 1_000):  # a tick a second for 90 s
        clock["ms"] = step
        announcer.tick()
    assert counter.snapshot() == {"dynamodb:PutItem": 3}
