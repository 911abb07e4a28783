"""The reconciler's Lambda: its schedule per stage, its settings and its least-privilege role."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage, synthesized

from agentq.config import env_name
from agentq.resources import ARTIFACTS_PREFIX, EVENT_OVERFLOW_PREFIX
from infra.stages import ReconcilerSettings, StageError

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=["dev", "prod"])
def stage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> SynthesizedStage:
    return synthesized(request.param, tmp_path_factory)


def _role_statements(stage: SynthesizedStage) -> list[dict[str, Any]]:
    template = stage.json("health-check")
    [function_id] = [
        logical_id
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function"
        and resource["Properties"]["Handler"] == "lambdas.reconciler.handler"
    ]
    role = template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements: list[dict[str, Any]] = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        if {"Ref": role} in resource["Properties"]["Roles"]:
            statements += resource["Properties"]["PolicyDocument"]["Statement"]
    return statements


def _actions(statement: dict[str, Any]) -> set[str]:
    actions = statement["Action"]
    return set(actions if isinstance(actions, list) else [actions])


def test_infra_reconciler_runs_on_the_stage_schedule_with_its_bounds(
    stage: SynthesizedStage,
) -> None:
    settings = stage.settings.reconciler
    template = stage.templates["health-check"]
    minutes = settings.rate_minutes
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": f"rate({minutes} minutes)",
            "State": "ENABLED",
            "Targets": [Match.object_like({"RetryPolicy": {"MaximumRetryAttempts": 0}})],
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "lambdas.reconciler.handler",
            "Environment": {
                "Variables": Match.object_like(
                    {
                        env_name("reconcile_lost_after_s"): str(settings.lost_after_s),
                        env_name("reconcile_stall_after_s"): str(settings.stall_after_s),
                        env_name("queue_url"): Match.any_value(),
                        env_name("bus_name"): Match.any_value(),
                    }
                )
            },
        },
    )


def test_infra_reconciler_role_holds_only_what_the_sweep_does(stage: SynthesizedStage) -> None:
    statements = _role_statements(stage)
    granted = set().union(*(_actions(s) for s in statements))
    table_actions = {a for a in granted if a.startswith("dynamodb:")}
    assert table_actions == {
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
    }
    assert {a for a in granted if a.startswith("sqs:")} == {"sqs:SendMessage"}
    assert "events:PutEvents" in granted
    s3 = [s for s in statements if any(a.startswith("s3:") for a in _actions(s))]
    assert {a for s in s3 for a in _actions(s)} == {"s3:GetObject", "s3:PutObject"}
    text = str(s3)
    assert ARTIFACTS_PREFIX in text and EVENT_OVERFLOW_PREFIX in text
    assert not any(a.endswith(("Scan", "DeleteItem", "PutItem", ":*")) for a in granted)


def test_infra_reconciler_repairs_raise_an_alarm(stage: SynthesizedStage) -> None:
    stage.templates["monitoring"].has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "Repairs",
            "Namespace": "agentq",
            # Every agentq metric carries its stage, so one stage never trips another's.
            "Dimensions": Match.array_with(
                [
                    {"Name": "service", "Value": "agentq-reconciler"},
                    {"Name": "stage", "Value": Match.any_value()},
                ]
            ),
            "Threshold": 1,
        },
    )
    stage.templates["monitoring"].has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"AlarmName": Match.string_like_regexp("reconciler-errors$")},
    )


def test_infra_reconciler_bound_below_the_visibility_timeout_is_refused() -> None:
    with pytest.raises(StageError, match="visibility timeout"):
        ReconcilerSettings(lost_after_s=60).check()
