"""The deploy rehearsal (infra/rehearsal.py): it fails on the prod templates as they were
before the first real deploy (a trimmed copy in fixtures/rehearsal), passes today's
synthesized stages, and each rule holds on a minimal template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _infra_stacks_common import fixture_dev, fixture_prod, fixture_stage  # noqa: F401
from infra_synth import SynthesizedStage

from infra.rehearsal import (
    Finding,
    Severity,
    alarms_reach_subscribers,
    custom_resource_timeouts,
    load_templates,
    main,
    rehearse,
    retained_fixed_names,
)

BEFORE = Path(__file__).parent / "fixtures" / "rehearsal"


def _errors(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.rule, f.stack, f.logical_id) for f in findings if f.severity == "error"}


def test_rehearsal_fails_the_prod_templates_of_before_naming_each_resource(
    capsys: pytest.CaptureFixture[str],
) -> None:
    findings = rehearse(load_templates([BEFORE]))
    assert _errors(findings) == {
        ("capacity-provider-association", "agentq-prod-worker", "ServiceD69D759B"),
        ("scaled-desired-count", "agentq-prod-worker", "ServiceD69D759B"),
        ("secret-before-service", "agentq-prod-worker", "ServiceD69D759B"),
        ("alarm-subscriber", "agentq-prod-monitoring", "dlqnotdrainingA1A2B059"),
    }
    assert main([str(BEFORE)]) == 1
    out = capsys.readouterr().out
    assert "agentq-prod-worker/ServiceD69D759B" in out
    assert "ClaudeApiKey6E1BA474" in out  # names the secret the first task cannot read


def test_rehearsal_passes_both_synthesized_stages(stage: SynthesizedStage) -> None:
    prefix = stage.settings.names.prefix
    templates = {f"{prefix}-{name}": stage.json(name) for name in stage.templates}
    # dev may have no alarm subscriber (a synth warning); prod's test synth has two.
    unsubscribed: Severity = "error" if stage.settings.is_production else "report"
    findings = rehearse(templates, unsubscribed_alarms=unsubscribed)
    assert not _errors(findings), [str(f) for f in findings if f.severity == "error"]


def test_rehearsal_reports_prods_retained_fixed_names_without_failing(
    prod: SynthesizedStage,
) -> None:
    reported = {
        f.logical_id: f.message
        for f in retained_fixed_names("agentq-prod-infrastructure", prod.json("infrastructure"))
    }
    names = prod.settings.names
    expected = [names.events_table, names.definitions_table, names.dead_letter_queue]
    expected += list(names.tier_queues().values())
    for name in expected:
        assert any(f" {name} is retained" in message for message in reported.values()), name
    # The runbook's teardown names each one with the command that deletes it.
    runbook = (Path(__file__).parents[2] / "docs" / "deploy.md").read_text()
    for name in expected:
        assert name.replace("agentq-prod-", "agentq-$STAGE-") in runbook or name in runbook


def _custom(timeout: Any, handler_timeout: int) -> dict[str, Any]:
    properties: dict[str, Any] = {"ServiceToken": {"Fn::GetAtt": ["Handler", "Arn"]}}
    if timeout is not None:
        properties["ServiceTimeout"] = timeout
    return {
        "Resources": {
            "Handler": {
                "Type": "AWS::Lambda::Function",
                "Properties": {"Timeout": handler_timeout},
            },
            "Loader": {"Type": "Custom::Loader", "Properties": properties},
        }
    }


def test_custom_resources_need_a_service_timeout_covering_their_handler() -> None:
    assert [f.logical_id for f in custom_resource_timeouts("s", _custom(None, 60))] == ["Loader"]
    (short,) = custom_resource_timeouts("s", _custom("300", 900))
    assert "shorter than its handler's 900 s" in short.message
    assert not list(custom_resource_timeouts("s", _custom("1200", 900)))


def test_alarms_on_scaling_policies_need_no_subscriber_and_silent_alarms_fail() -> None:
    template = {
        "Resources": {
            "Policy": {"Type": "AWS::ApplicationAutoScaling::ScalingPolicy", "Properties": {}},
            "Scales": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {"AlarmActions": [{"Ref": "Policy"}]},
            },
            "Silent": {"Type": "AWS::CloudWatch::Alarm", "Properties": {}},
        }
    }
    assert [f.logical_id for f in alarms_reach_subscribers("s", template)] == ["Silent"]


def test_a_retained_resource_without_a_fixed_name_is_not_reported() -> None:
    template = {
        "Resources": {
            "Named": {"Type": "AWS::SQS::Queue", "DeletionPolicy": "Retain",
                      "Properties": {"QueueName": "x"}},
            "Unnamed": {"Type": "AWS::SQS::Queue", "DeletionPolicy": "Retain", "Properties": {}},
            "Deleted": {"Type": "AWS::SQS::Queue", "DeletionPolicy": "Delete",
                        "Properties": {"QueueName": "y"}},
        }
    }  # fmt: skip
    assert [f.logical_id for f in retained_fixed_names("s", template)] == ["Named"]
