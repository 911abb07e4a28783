"""The overview dashboard's per-tier and per-tenant widgets name the metrics, with the
dimension sets, that SQS and the worker (worker/telemetry.py) actually emit."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage, synthesized

from agentq.resources import PRIORITY_TIERS


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("dev", tmp_path_factory)


def _token(part: Any) -> str:
    # A reference to another stack's value (a queue's name): kept readable in the body.
    return "<" + re.sub(r"[^A-Za-z0-9:_-]", "", json.dumps(part)) + ">"


def _widgets(stage: SynthesizedStage) -> dict[str, dict[str, Any]]:
    (dashboard,) = stage.resources("monitoring", "AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = json.loads("".join(p if isinstance(p, str) else _token(p) for p in parts))
    return {
        w["properties"]["title"]: w["properties"]
        for w in body["widgets"]
        if "title" in w["properties"]
    }


def _lines(widget: dict[str, Any]) -> list[list[Any]]:
    return [m for m in widget["metrics"] if isinstance(m, list)]


def test_the_dashboard_is_in_the_template(dev: SynthesizedStage) -> None:
    dev.templates["monitoring"].has_resource_properties(
        "AWS::CloudWatch::Dashboard",
        {
            "DashboardName": Match.string_like_regexp("-overview$"),
            "DashboardBody": Match.any_value(),
        },
    )


@pytest.mark.parametrize(
    ("title", "left", "right", "stat"),
    [
        ("Claims and completions by tier", "TasksStarted", "TasksCompleted", "Sum"),
        ("Failures and timeouts by tier", "TasksFailed", "TasksTimedOut", "Sum"),
        ("Processing time by tier (ms, p50 and p95)", "TaskDuration", "TaskDuration", None),
        ("Lock latency by tier (ms, p50 and p95)", "LockLatency", "LockLatency", None),
    ],
)
def test_worker_widgets_have_one_line_per_tier_with_its_tier_and_stage(
    dev: SynthesizedStage, title: str, left: str, right: str, stat: str | None
) -> None:
    stage = dev.settings.name
    lines = _lines(_widgets(dev)[title])
    expected = [(left, tier, stat or "p50", "left") for tier in PRIORITY_TIERS] + [
        (right, tier, stat or "p95", "right") for tier in PRIORITY_TIERS
    ]
    found = [(line[1], line[7], line[-1]["stat"], line[-1].get("yAxis", "left")) for line in lines]
    assert found == expected
    for line in lines:
        # Exactly the dimension set of the worker's per-tier lines.
        assert line[:8] == ["agentq", line[1], "service", "worker", "stage", stage, "tier", line[7]]
        assert line[-1]["label"] == (line[7] if stat else f"{line[7]} {line[-1]['stat']}")


def test_queue_widgets_read_each_tier_queues_own_sqs_metrics(dev: SynthesizedStage) -> None:
    widgets = _widgets(dev)
    names = dev.settings.names.tier_queues()
    for title, metric in (
        ("Waiting and delayed messages by tier", "ApproximateNumberOfMessagesVisible"),
        ("Waiting and delayed messages by tier", "ApproximateNumberOfMessagesDelayed"),
        (
            "In flight by tier (messages, and tasks running)",
            "ApproximateNumberOfMessagesNotVisible",
        ),
        ("Oldest message age by tier, and the DLQ (s)", "ApproximateAgeOfOldestMessage"),
    ):
        lines = [line for line in _lines(widgets[title]) if line[:2] == ["AWS/SQS", metric]]
        # One line per tier queue (and, for the age, the DLQ's), each by its QueueName.
        labelled = {line[-1]["label"]: line[3] for line in lines}
        for tier in PRIORITY_TIERS:
            label = next(k for k in labelled if k.split()[0] == tier)
            queue = labelled[label]
            assert names[tier] in queue or tier in queue or "TaskQueue" in queue, (title, queue)
        assert all(line[2] == "QueueName" for line in lines)
    in_flight = _lines(widgets["In flight by tier (messages, and tasks running)"])
    running = [line for line in in_flight if line[1] == "TasksInFlight"]
    assert [line[7] for line in running] == list(PRIORITY_TIERS)
    assert all(line[-1]["stat"] == "Maximum" for line in running)
    ages = _lines(widgets["Oldest message age by tier, and the DLQ (s)"])
    assert any(line[-1]["label"] == "dead letters" for line in ages)


def test_dlq_consumers_and_tenant_widgets(dev: SynthesizedStage) -> None:
    stage = dev.settings.name
    widgets = _widgets(dev)
    dlq = widgets["Dead letters (waiting, and settled by the DLQ processor)"]
    assert any(
        line[:2] == ["AWS/SQS", "ApproximateNumberOfMessagesVisible"] for line in _lines(dlq)
    )
    assert any("expression" in line[0] and "FILL(d0, 0)" in line[0]["expression"]
               for line in _lines(dlq))  # fmt: skip
    consumers = _lines(widgets["Consumers: workers and slots"])
    assert any(line[:2] == ["ECS/ContainerInsights", "RunningTaskCount"] for line in consumers)
    assert any(line[:2] == ["agentq", "Slots"] and line[5] == stage for line in consumers)
    assert any("expression" in line[0] and line[0]["expression"] ==
               "FILL(running, 0) * FILL(slots, 0)" for line in consumers)  # fmt: skip
    for metric in ("TasksStarted", "TasksFailed", "TasksTimedOut"):
        title = f"{metric} by tenant (METRIC_TENANTS, the rest as (other))"
        (line,) = _lines(widgets[title])
        expression = line[0]["expression"]
        # Exactly the worker's tenant dimension set, this stage only.
        assert expression.startswith("SEARCH('{agentq,service,stage,tenant} "), expression
        assert f'MetricName="{metric}"' in expression and f'stage="{stage}"' in expression
        assert 'service="worker"' in expression
