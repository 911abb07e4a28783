"""agentq.stats on AWS's side: the oldest message ages from SQS's CloudWatch metric, in
one `GetMetricData`, and the reads counted (moto, in process)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from conftest import Stack

from agentq.aws import CallCounter
from agentq.config import Settings
from agentq.stats import StatsReader


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
    assert counter.total() - before == data["requests"] == 18
