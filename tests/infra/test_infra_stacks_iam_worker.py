"""Both stages' synthesized templates: IAM, the worker's task and scaling, alarms; stage checks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _infra_stacks_common import (  # noqa: F401 (fixture_stage: the stage fixture)
    RUNTIME_HANDLERS,
    fixture_stage,
)
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage

from agentq.config import env_name
from agentq.resources import ARTIFACTS_PREFIX, DLQ_ARCHIVE_PREFIX, EVENT_OVERFLOW_PREFIX
from infra.stages import FARGATE_MAX_STOP_TIMEOUT_S, stage_settings

pytestmark = pytest.mark.timeout(600)

# Actions AWS authorizes only on Resource "*" (no resource-level permissions exist).
STAR_ONLY_ACTIONS = {
    "cloudwatch:GetMetricStatistics",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "ecr:GetAuthorizationToken",
}


def _statements(stage: SynthesizedStage) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for stack, policy in stage.all_resources("AWS::IAM::Policy"):
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found.append((stack, statement))
    return found


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- IAM ----------------------------------------------------------------------------------


def test_infra_no_wildcard_resource_except_where_aws_allows_nothing_else(
    stage: SynthesizedStage,
) -> None:
    for stack, statement in _statements(stage):
        resources = _as_list(statement["Resource"])
        actions = set(_as_list(statement["Action"]))
        if "*" in resources:
            assert actions <= STAR_ONLY_ACTIONS, (stack, statement)
        for resource in resources:
            text = json.dumps(resource)
            # Object wildcards only under agentq's own key prefixes, task wildcards only
            # in the stage's own cluster (task ARNs are made at run time).
            if "*" in text and resource != "*":
                assert (
                    any(
                        f"/{prefix}*" in text
                        for prefix in (ARTIFACTS_PREFIX, EVENT_OVERFLOW_PREFIX, DLQ_ARCHIVE_PREFIX)
                    )
                    or f":task/{stage.settings.names.prefix}/*" in text
                    # The provider framework invokes the definitions loader's versions.
                    or (actions == {"lambda:InvokeFunction"} and "DefinitionsLoader" in text)
                ), (stack, statement)


def test_infra_worker_task_role_is_least_privilege(stage: SynthesizedStage) -> None:
    worker = stage.stacks.worker
    role_id = worker.get_logical_id(worker.task_role.node.default_child)  # type: ignore[arg-type]
    statements = [
        statement
        for policy in stage.resources("worker", "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    by_action: dict[str, list[Any]] = {}
    for statement in statements:
        for action in _as_list(statement["Action"]):
            by_action.setdefault(action, []).extend(_as_list(statement["Resource"]))
    assert set(by_action) == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
        "sqs:SendMessage",  # a requeue and a forward to a priority tier are sends
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:Scan",
        "events:PutEvents",
        "s3:PutObject",
        # A resumable agent task's retry reads an earlier attempt's session checkpoint.
        "s3:GetObject",
        # The ECS agent's task-protection endpoint acts with the task role.
        "ecs:UpdateTaskProtection",
        "ecs:GetTaskProtection",
        # The start-up checks, on the stage's own bus and bucket (worker/preflight.py).
        "events:DescribeEventBus",
        "s3:GetBucketLocation",
    }
    protection = json.dumps(by_action["ecs:UpdateTaskProtection"])
    assert f":task/{stage.settings.names.prefix}/*" in protection
    # Queue actions on the task queues alone (one imported ARN per tier, not the DLQ).
    for action in ("sqs:ReceiveMessage", "sqs:SendMessage"):
        queue_resources = by_action[action]
        assert len(queue_resources) == len(stage.settings.names.tier_queues())
        assert "TaskQueue" in json.dumps(queue_resources)
        assert "DeadLetter" not in json.dumps(queue_resources)
    # Scan only on the definitions table; writes only on the events table and its indexes.
    assert "DefinitionsTable" in json.dumps(by_action["dynamodb:Scan"])
    assert "EventsTable" not in json.dumps(by_action["dynamodb:Scan"])
    assert "DefinitionsTable" not in json.dumps(by_action["dynamodb:UpdateItem"])
    put_objects = json.dumps(by_action["s3:PutObject"])
    assert f"/{ARTIFACTS_PREFIX}*" in put_objects
    assert f"/{EVENT_OVERFLOW_PREFIX}*" in put_objects
    assert len(by_action["s3:PutObject"]) == 2
    # Reads only under the task prefix (never the overflowed events nor the DLQ archive).
    (get_objects,) = by_action["s3:GetObject"]
    assert f"/{ARTIFACTS_PREFIX}*" in json.dumps(get_objects)


# -- worker -------------------------------------------------------------------------------


def test_infra_worker_runs_the_repo_image_with_secrets_and_a_long_enough_stop(
    stage: SynthesizedStage,
) -> None:
    worker = stage.settings.worker
    definitions = stage.resources("worker", "AWS::ECS::TaskDefinition")
    (definition,) = definitions.values()
    (container,) = definition["Properties"]["ContainerDefinitions"]
    assert container["StopTimeout"] == worker.stop_timeout_s <= FARGATE_MAX_STOP_TIMEOUT_S
    variables = {v["Name"]: v["Value"] for v in container["Environment"]}
    drain_ms = int(variables[env_name("drain_timeout_ms")])
    assert drain_ms < container["StopTimeout"] * 1000
    assert variables[env_name("max_concurrent")] == str(worker.slots)
    assert variables[env_name("warm_agent")] == worker.warm_agent
    assert [s["Name"] for s in container["Secrets"]] == ["ANTHROPIC_API_KEY"]
    assert container["LinuxParameters"]["InitProcessEnabled"] is True
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert "cdk-hnb659fds-container-assets" in json.dumps(container["Image"])
    stage.templates["worker"].has_resource_properties(
        "AWS::ECS::Cluster",
        {"ClusterSettings": [{"Name": "containerInsights", "Value": "enabled"}]},
    )
    stage.templates["worker"].has_resource_properties(
        "AWS::Logs::LogGroup", {"RetentionInDays": Match.any_value()}
    )


def test_infra_worker_scales_on_backlog_per_task_from_zero(stage: SynthesizedStage) -> None:
    worker = stage.settings.worker
    template = stage.templates["worker"]
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {"MinCapacity": worker.min_tasks, "MaxCapacity": worker.max_tasks},
    )
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": worker.backlog_per_task,
                "CustomizedMetricSpecification": {
                    "Metrics": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Id": "visible0",
                                    "MetricStat": Match.object_like(
                                        {
                                            "Metric": Match.object_like(
                                                {
                                                    "Namespace": "AWS/SQS",
                                                    "MetricName": (
                                                        "ApproximateNumberOfMessagesVisible"
                                                    ),
                                                }
                                            )
                                        }
                                    ),
                                }
                            ),
                            Match.object_like({"Id": "running"}),
                            {
                                "Id": "backlogPerTask",
                                # Every tier's backlog, weighted towards high.
                                "Expression": (
                                    "(2 * visible0 + 1 * visible1 + 0.5 * visible2) / running"
                                ),
                                "Label": Match.any_value(),
                                "ReturnData": True,
                            },
                        ]
                    )
                },
            },
        },
    )
    # The zero-task case: a step policy adding one task while nothing runs and work waits.
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "StepScaling",
            "StepScalingPolicyConfiguration": Match.object_like(
                {
                    "AdjustmentType": "ChangeInCapacity",
                    "StepAdjustments": Match.array_with(
                        [Match.object_like({"ScalingAdjustment": 1})]
                    ),
                }
            ),
        },
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "Metrics": Match.array_with(
                [
                    Match.object_like(
                        {"Expression": Match.string_like_regexp(r"FILL\(running, 0\) == 0")}
                    )
                ]
            )
        },
    )
    # Nothing scales on CPU, so nothing fights the queue policy.
    text = json.dumps(stage.json("worker"))
    assert "ECSServiceAverageCPUUtilization" not in text
    assert len(stage.resources("worker", "AWS::ApplicationAutoScaling::ScalingPolicy")) == 2


# -- alarms and dashboard -----------------------------------------------------------------


def test_infra_alarms_cover_dlq_age_lambdas_and_worker_metrics(stage: SynthesizedStage) -> None:
    limits = stage.settings.alarms
    template = stage.templates["monitoring"]
    # Dead-lettered tasks are counted by the DLQ processor (the DLQ itself is emptied
    # within seconds, so its visible count would almost never alarm).
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": Match.string_like_regexp("dead-lettered-tasks$"),
            "Threshold": limits.dlq_messages,
            "Metrics": Match.array_with(
                [Match.object_like({"Expression": Match.string_like_regexp(r"FILL\(d0, 0\)")})]
            ),
            "AlarmActions": [{"Ref": Match.string_like_regexp("Alarms")}],
        },
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": limits.oldest_message_age_s},
    )
    # A dead letter still there (received or not) for some periods: not the oldest age,
    # which SQS stops reporting for a message received three times or more.
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": Match.string_like_regexp("dlq-not-draining$"),
            "EvaluationPeriods": limits.dlq_stuck_periods,
            "Metrics": Match.array_with(
                [Match.object_like({"Expression": "FILL(visible, 0) + FILL(inflight, 0)"})]
            ),
        },
    )
    for metric in ("TasksFailed", "TasksTimedOut"):
        template.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {
                "Namespace": "agentq",
                "MetricName": metric,
                "Dimensions": Match.array_with(
                    [
                        {"Name": "service", "Value": "worker"},
                        {"Name": "stage", "Value": stage.settings.name},
                    ]
                ),
            },
        )
    alarms = stage.resources("monitoring", "AWS::CloudWatch::Alarm").values()
    for metric_name in ("Errors", "Throttles"):
        assert len([a for a in alarms if a["Properties"].get("MetricName") == metric_name]) == len(
            RUNTIME_HANDLERS
        )
    failed_event_alarms = [
        a for a in alarms if a["Properties"]["AlarmName"].endswith("-failed-events")
    ]
    assert len(failed_event_alarms) == 2
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})


# -- stage settings -----------------------------------------------------------------------


def test_infra_stage_settings_refuse_a_drain_longer_than_ecs_waits() -> None:
    from dataclasses import replace

    from infra.stages import StageError, WorkerSettings

    with pytest.raises(StageError, match="drain_timeout_s"):
        WorkerSettings(drain_timeout_s=120, stop_timeout_s=120).check()
    with pytest.raises(StageError, match="Fargate"):
        WorkerSettings(stop_timeout_s=180).check()
    with pytest.raises(StageError, match="min"):
        replace(stage_settings("dev"), worker=WorkerSettings(min_tasks=3, max_tasks=2))
    with pytest.raises(StageError, match="unknown stage 'staging'"):
        stage_settings("staging")
    assert stage_settings("prod", app_name="acme").names.task_queue == "acme-prod-tasks"
