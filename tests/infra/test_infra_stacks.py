"""Assertions on the synthesized templates of both stages: the properties that matter."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage, synthesized

from agentq.config import env_name
from agentq.resources import (
    ARTIFACTS_PREFIX,
    DISPATCHER_RULE,
    DLQ_ARCHIVE_PREFIX,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
    SAVE_EVENT_RULE,
    TASK_QUEUE,
)
from infra.stages import FARGATE_MAX_STOP_TIMEOUT_S, stage_settings

pytestmark = pytest.mark.timeout(600)

# The functions that run while the stage does; each has error and throttle alarms.
RUNTIME_HANDLERS = {
    "lambdas.save_event.handler",
    "lambdas.dlq_processor.handler",
    "lambdas.health_check.handler",
    "lambdas.dispatcher.handler",
    "lambdas.producer_api.handler",
    "lambdas.reconciler.handler",
}
# Runs only inside `cdk deploy`, which reports its failure itself (no alarm), and reads
# its table's name from the custom resource, not from its environment.
DEPLOY_HANDLERS = {"lambdas.definitions_loader.handler"}
HANDLERS = RUNTIME_HANDLERS | DEPLOY_HANDLERS
# CDK's custom-resource provider framework (Node.js, its own asset): not agentq code.
FRAMEWORK_HANDLER = "framework.onEvent"
# Actions AWS authorizes only on Resource "*" (no resource-level permissions exist).
STAR_ONLY_ACTIONS = {
    "cloudwatch:GetMetricStatistics",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "ecr:GetAuthorizationToken",
}


@pytest.fixture(scope="module", params=["dev", "prod"])
def stage(request: pytest.FixtureRequest) -> SynthesizedStage:
    return synthesized(request.param)


@pytest.fixture(scope="module")
def dev() -> SynthesizedStage:
    return synthesized("dev")


@pytest.fixture(scope="module")
def prod() -> SynthesizedStage:
    return synthesized("prod")


def _statements(stage: SynthesizedStage) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for stack, policy in stage.all_resources("AWS::IAM::Policy"):
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found.append((stack, statement))
    return found


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def queue_resources_of(by_action: dict[str, list[Any]]) -> list[Any]:
    return by_action["sqs:ReceiveMessage"]


# -- infrastructure ------------------------------------------------------------------------


def test_infra_task_queue_redrives_to_the_dlq_after_max_receives(stage: SynthesizedStage) -> None:
    template = stage.templates["infrastructure"]
    names = stage.stacks.settings.names
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "QueueName": names.task_queue,
            "VisibilityTimeout": TASK_QUEUE.visibility_timeout_s,
            "ReceiveMessageWaitTimeSeconds": TASK_QUEUE.receive_wait_s,
            "SqsManagedSseEnabled": True,
            "RedrivePolicy": {
                "deadLetterTargetArn": {
                    "Fn::GetAtt": [Match.string_like_regexp("DeadLetter"), "Arn"]
                },
                "maxReceiveCount": TASK_QUEUE.max_receive_count,
            },
        },
    )
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "QueueName": names.dead_letter_queue,
            "MessageRetentionPeriod": TASK_QUEUE.dlq_retention_days * 86_400,
        },
    )
    # Every queue (the DLQ, one per priority tier, and the Task Requested rule's DLQ)
    # refuses plain-HTTP requests.
    template.resource_count_is("AWS::SQS::QueuePolicy", 2 + len(names.tier_queues()))
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_infra_events_table_has_the_shared_indexes_ttl_and_pitr(stage: SynthesizedStage) -> None:
    stage.templates["infrastructure"].has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TableName": stage.stacks.settings.names.events_table,
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [
                {"AttributeName": EVENTS_TABLE.partition_key, "KeyType": "HASH"},
                {"AttributeName": EVENTS_TABLE.sort_key, "KeyType": "RANGE"},
            ],
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": index.name,
                    "KeySchema": [
                        {"AttributeName": index.partition_key, "KeyType": "HASH"},
                        {"AttributeName": index.sort_key, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
                for index in EVENTS_TABLE.indexes
            ],
            "TimeToLiveSpecification": {
                "AttributeName": EVENTS_TABLE.ttl_attribute,
                "Enabled": True,
            },
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        },
    )


def test_infra_prod_keeps_stateful_resources_dev_does_not(
    dev: SynthesizedStage, prod: SynthesizedStage
) -> None:
    prod.templates["infrastructure"].has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "Retain",
            "Properties": Match.object_like({"DeletionProtectionEnabled": True}),
        },
    )
    dev.templates["infrastructure"].has_resource(
        "AWS::DynamoDB::Table", {"DeletionPolicy": "Delete"}
    )


def test_infra_artifacts_bucket_is_private_encrypted_logged_and_expires(
    stage: SynthesizedStage,
) -> None:
    settings = stage.stacks.settings
    template = stage.templates["infrastructure"]
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                ]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "LoggingConfiguration": {
                "DestinationBucketName": {"Ref": Match.string_like_regexp("AccessLogs")},
                "LogFilePrefix": Match.any_value(),
            },
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Prefix": ARTIFACTS_PREFIX,
                                "ExpirationInDays": settings.artifact_expiry_days,
                                "Status": "Enabled",
                            }
                        ),
                        Match.object_like(
                            {
                                "Prefix": EVENT_OVERFLOW_PREFIX,
                                "ExpirationInDays": settings.overflow_expiry_days,
                                "Status": "Enabled",
                            }
                        ),
                    ]
                )
            },
        },
    )
    policies = stage.resources("infrastructure", "AWS::S3::BucketPolicy")
    assert len(policies) == 2
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in statements
        )


def test_infra_shared_resources_cross_stacks_as_references_not_names(
    stage: SynthesizedStage,
) -> None:
    outputs = stage.json("infrastructure").get("Outputs", {})
    exports = {o["Export"]["Name"] for o in outputs.values() if "Export" in o}
    assert exports, "the core stack exports nothing; consumers would hard-code names"
    for name in ("events", "dispatcher", "worker", "producer-api", "health-check"):
        text = json.dumps(stage.json(name))
        assert "Fn::ImportValue" in text, name
        # The bucket is CloudFormation-named: nothing but an import can know it.
        assert stage.stacks.settings.names.local_bucket not in text


# -- Lambdas and rules ----------------------------------------------------------------------


def test_infra_lambdas_use_the_shared_asset_handlers_and_runtime(stage: SynthesizedStage) -> None:
    every = [r["Properties"] for _, r in stage.all_resources("AWS::Lambda::Function")]
    assert [f["Handler"] for f in every].count(FRAMEWORK_HANDLER) == 1
    assert "LoggingConfig" in next(f for f in every if f["Handler"] == FRAMEWORK_HANDLER)
    functions = [f for f in every if f["Handler"] != FRAMEWORK_HANDLER]
    assert {f["Handler"] for f in functions} == HANDLERS
    for function in functions:
        assert function["Runtime"] in {"python3.13", "python3.14"}
        assert function["TracingConfig"] == {"Mode": "Active"}
        variables = function["Environment"]["Variables"]
        assert variables[env_name("stage")] == stage.stacks.settings.name
        if function["Handler"] in RUNTIME_HANDLERS:
            assert env_name("table_name") in variables
        assert "LoggingConfig" in function  # its own log group, with retention
    # One code asset for every function.
    keys = {json.dumps(f["Code"]["S3Key"]) for f in functions}
    assert len(keys) == 1


def test_infra_rules_use_the_shared_patterns(stage: SynthesizedStage) -> None:
    app_name = stage.stacks.settings.app_name
    stage.templates["events"].has_resource_properties(
        "AWS::Events::Rule", {"EventPattern": SAVE_EVENT_RULE.pattern(app_name)}
    )
    stage.templates["dispatcher"].has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": DISPATCHER_RULE.pattern(app_name),
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [Match.any_value(), "Arn"]}})],
        },
    )


def test_infra_event_driven_lambdas_keep_events_they_fail_on(stage: SynthesizedStage) -> None:
    for stack in ("events", "dispatcher"):
        template = stage.templates[stack]
        rule_targets = [
            target
            for rule in stage.resources(stack, "AWS::Events::Rule").values()
            for target in rule["Properties"]["Targets"]
        ]
        assert rule_targets
        for target in rule_targets:
            assert target["RetryPolicy"] == {
                "MaximumEventAgeInSeconds": 86_400,
                "MaximumRetryAttempts": 185,
            }
            queue_id = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
            function = template.find_resources(
                "AWS::Lambda::Function",
                {
                    "Properties": {
                        "DeadLetterConfig": {"TargetArn": {"Fn::GetAtt": [queue_id, "Arn"]}}
                    }
                },
            )
            assert len(function) == 1, stack


def test_infra_dlq_processor_reports_partial_batch_failures(stage: SynthesizedStage) -> None:
    stage.templates["events"].has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "BatchSize": stage.stacks.settings.dlq_batch_size,
            "EventSourceArn": {"Fn::ImportValue": Match.string_like_regexp("DeadLetter")},
        },
    )


def test_infra_health_check_schedule_follows_the_stage(
    dev: SynthesizedStage, prod: SynthesizedStage
) -> None:
    dev.templates["health-check"].has_resource_properties(
        "AWS::Events::Rule", {"ScheduleExpression": "rate(1 hour)", "State": "DISABLED"}
    )
    prod.templates["health-check"].has_resource_properties(
        "AWS::Events::Rule", {"ScheduleExpression": "rate(5 minutes)", "State": "ENABLED"}
    )
    prod.templates["health-check"].has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {env_name("slack_token_secret_arn"): {"Ref": Match.string_like_regexp("Slack")}}
                )
            }
        },
    )


def test_infra_producer_api_requires_iam_auth_and_logs_access(stage: SynthesizedStage) -> None:
    template = stage.templates["producer-api"]
    methods = stage.resources("producer-api", "AWS::ApiGateway::Method")
    assert methods
    assert {m["Properties"]["AuthorizationType"] for m in methods.values()} == {"AWS_IAM"}
    template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "AccessLogSetting": {
                "DestinationArn": {"Fn::GetAtt": [Match.string_like_regexp("AccessLogs"), "Arn"]},
                "Format": Match.any_value(),
            },
            "TracingEnabled": True,
        },
    )


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
                    or f":task/{stage.stacks.settings.names.prefix}/*" in text
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
        # The ECS agent's task-protection endpoint acts with the task role.
        "ecs:UpdateTaskProtection",
        "ecs:GetTaskProtection",
    }
    protection = json.dumps(by_action["ecs:UpdateTaskProtection"])
    assert f":task/{stage.stacks.settings.names.prefix}/*" in protection
    # Queue actions on the task queues alone (one imported ARN per tier, not the DLQ).
    for action in ("sqs:ReceiveMessage", "sqs:SendMessage"):
        queue_resources = by_action[action]
        assert len(queue_resources) == len(stage.stacks.settings.names.tier_queues())
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


# -- worker -------------------------------------------------------------------------------


def test_infra_worker_runs_the_repo_image_with_secrets_and_a_long_enough_stop(
    stage: SynthesizedStage,
) -> None:
    worker = stage.stacks.settings.worker
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
    worker = stage.stacks.settings.worker
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
    limits = stage.stacks.settings.alarms
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
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": limits.dlq_oldest_age_s},
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
                        {"Name": "stage", "Value": stage.stacks.settings.name},
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
