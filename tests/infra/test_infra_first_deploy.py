"""What a first real deploy and its first week need from the synthesized stages: the
worker's secret filled before the worker exists, the service's create and update
rules, alarms that reach someone and see what they claim to, the narrowed save-event
rule, Lambda concurrency caps, and a reproducible worker image."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from _infra_stacks_common import fixture_dev, fixture_prod, fixture_stage  # noqa: F401
from aws_cdk.assertions import Annotations, Match
from infra_synth import ALARM_EMAIL, SynthesizedStage

from agentq.resources import EVENTS_TABLE, SAVE_EVENT_SKIPPED_TYPES, SECRET_PLACEHOLDER
from infra.app import build_app
from infra.secrets_ready import ANTHROPIC_KEY_OUTPUT
from infra.stages import SlackChannel, StageError, stage_settings

REPO = Path(__file__).resolve().parents[2]


def _service(stage: SynthesizedStage) -> tuple[str, dict[str, Any]]:
    ((logical_id, service),) = stage.resources("worker", "AWS::ECS::Service").items()
    return logical_id, service


def test_the_worker_secret_is_in_a_stack_of_its_own_with_its_arn_as_an_output(
    stage: SynthesizedStage,
) -> None:
    (secret,) = stage.resources("secrets", "AWS::SecretsManager::Secret").values()
    assert secret["Properties"]["SecretString"] == SECRET_PLACEHOLDER
    stage.templates["secrets"].has_output(
        ANTHROPIC_KEY_OUTPUT, {"Value": {"Ref": Match.any_value()}}
    )
    # The worker stack creates no secret: its task reads the one the operator filled.
    assert not stage.resources("worker", "AWS::SecretsManager::Secret")
    (definition,) = stage.resources("worker", "AWS::ECS::TaskDefinition").values()
    (container,) = definition["Properties"]["ContainerDefinitions"]
    (key,) = container["Secrets"]
    assert key["Name"] == "ANTHROPIC_API_KEY"
    assert "Fn::ImportValue" in str(key["ValueFrom"])
    assert f"{stage.settings.names.prefix}-secrets" in [
        s.stack_name for s in stage.stacks.worker.dependencies
    ]


def test_the_autoscaled_service_has_no_desired_count_and_waits_for_its_providers(
    stage: SynthesizedStage,
) -> None:
    _, service = _service(stage)
    assert "DesiredCount" not in service["Properties"]
    (association,) = stage.resources("worker", "AWS::ECS::ClusterCapacityProviderAssociations")
    assert association in service["DependsOn"]


def test_a_production_stage_without_alarm_subscribers_fails_synth() -> None:
    app = cdk.App(context={"stage": "prod"})
    with pytest.raises(StageError, match=r"no alarm subscriber.*-c alarm_emails="):
        build_app(app, nag=False)


def test_alarm_subscribers_come_from_the_stage_and_the_context() -> None:
    settings = stage_settings("prod", alarm_emails=["a@example.com"], alarm_slack=["T1/C2"])
    assert settings.alarms.emails == ("a@example.com",)
    assert settings.alarms.slack_channels == (SlackChannel(workspace_id="T1", channel_id="C2"),)
    with pytest.raises(StageError, match="WORKSPACE_ID/CHANNEL_ID"):
        stage_settings("prod", alarm_slack=["C2"])
    with pytest.raises(StageError, match="not an address"):
        stage_settings("prod", alarm_emails=["nobody"])


def test_prods_alarm_topic_reaches_email_and_slack(prod: SynthesizedStage) -> None:
    ((topic_id, _),) = prod.resources("monitoring", "AWS::SNS::Topic").items()
    prod.templates["monitoring"].has_resource_properties(
        "AWS::SNS::Subscription",
        {"Protocol": "email", "Endpoint": ALARM_EMAIL, "TopicArn": {"Ref": topic_id}},
    )
    prod.templates["monitoring"].has_resource_properties(
        "AWS::Chatbot::SlackChannelConfiguration",
        {"SnsTopicArns": [{"Ref": topic_id}], "SlackChannelId": "C0ALARMS1"},
    )


def test_a_dev_stage_without_subscribers_synthesizes_with_a_warning(dev: SynthesizedStage) -> None:
    assert not dev.resources("monitoring", "AWS::SNS::Subscription")
    Annotations.from_stack(dev.stacks.monitoring).has_warning(
        "*", Match.string_like_regexp("alarm topic has no subscriber")
    )


def _alarms(stage: SynthesizedStage) -> dict[str, dict[str, Any]]:
    prefix = f"{stage.settings.names.prefix}-"
    return {
        alarm["Properties"]["AlarmName"].removeprefix(prefix): alarm["Properties"]
        for alarm in stage.resources("monitoring", "AWS::CloudWatch::Alarm").values()
    }


def test_alarms_watch_table_throttles_and_the_reconciler(stage: SynthesizedStage) -> None:
    alarms = _alarms(stage)
    expected = {"events-table-throttles", "definitions-table-throttles"}
    expected |= {f"events-table-{index.name}-throttles" for index in EVENTS_TABLE.indexes}
    expected |= {"reconciler-errors", "reconciler-schedule-rule-failed-invocations"}
    assert expected <= set(alarms)
    by_index = alarms[f"events-table-{EVENTS_TABLE.indexes[0].name}-throttles"]["Metrics"]
    dimensions = [m["MetricStat"]["Metric"]["Dimensions"] for m in by_index if "MetricStat" in m]
    assert all({"Name": "GlobalSecondaryIndexName", "Value": EVENTS_TABLE.indexes[0].name}
               in d for d in dimensions) and len(dimensions) == 2  # fmt: skip
    schedule = alarms["reconciler-schedule-rule-failed-invocations"]
    assert schedule["MetricName"] == "FailedInvocations"
    health = alarms["health-check-schedule-rule-failed-invocations"]
    # Its own schedule's rule, on the default bus (a RuleName dimension only).
    assert [d["Name"] for d in schedule["Dimensions"]] == ["RuleName"]
    assert schedule["Dimensions"] != health["Dimensions"]


def test_the_dlq_alarm_counts_dead_letters_in_flight_too(stage: SynthesizedStage) -> None:
    alarm = _alarms(stage)["dlq-not-draining"]
    metrics = {m["Id"]: m for m in alarm["Metrics"]}
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in metrics.values() if "MetricStat" in m}
    # Not the oldest message's age: SQS leaves out messages received three times or more.
    assert names == {"ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible"}
    assert alarm["EvaluationPeriods"] == stage.settings.alarms.dlq_stuck_periods
    assert alarm["Threshold"] == 1


def test_the_save_event_rule_leaves_out_what_save_event_would_drop(
    stage: SynthesizedStage,
) -> None:
    (rule,) = stage.resources("events", "AWS::Events::Rule").values()
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["detail-type"] == [{"anything-but": list(SAVE_EVENT_SKIPPED_TYPES)}]


def _functions(stage: SynthesizedStage) -> dict[str, dict[str, Any]]:
    return {
        resource["Properties"]["Handler"].split(".")[1]: resource["Properties"]
        for _, resource in stage.all_resources("AWS::Lambda::Function")
        if resource["Properties"].get("Handler", "").startswith("lambdas.")
    }


def test_prod_caps_the_lambdas_a_runaway_would_hurt(prod: SynthesizedStage) -> None:
    reserved = {
        name: properties.get("ReservedConcurrentExecutions")
        for name, properties in _functions(prod).items()
    }
    assert reserved["save_event"] and reserved["dispatcher"]
    assert reserved["reconciler"] == reserved["health_check"] == 1
    # The producer API answers callers (API Gateway throttles it); the loader runs in deploys.
    assert reserved["producer_api"] is None and reserved["definitions_loader"] is None
    (mapping,) = prod.resources("events", "AWS::Lambda::EventSourceMapping").values()
    assert mapping["Properties"]["ScalingConfig"] == {"MaximumConcurrency": 2}


def test_dev_reserves_no_concurrency_a_new_account_may_not_have(dev: SynthesizedStage) -> None:
    assert all("ReservedConcurrentExecutions" not in p for p in _functions(dev).values())


def test_the_image_base_is_pinned_by_digest_and_installs_a_hashed_lock() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.13-slim@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert "RUN pip install --require-hashes --no-deps -r requirements-image.lock" in dockerfile
    assert "!requirements-image.lock" in (REPO / ".dockerignore").read_text().splitlines()
    lock = (REPO / "requirements-image.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.M))
    # Every requirement in the lock carries at least one hash.
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock)
    assert all("--hash=sha256:" in b for b in blocks if re.match(r"[A-Za-z0-9_.-]+==", b))
    # The lock agrees with requirements.txt, which `make install` and the tests use.
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            normalized = {k.lower().replace("_", "-"): v for k, v in pins.items()}
            assert normalized.get(name.lower().replace("_", "-")) == version.strip(), name
