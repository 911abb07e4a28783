"""Both stages' synthesized templates: the core resources, the Lambdas, rules and the API."""

from __future__ import annotations

import json

import pytest
from _infra_stacks_common import (  # noqa: F401 (fixture_*: the stage, dev and prod fixtures)
    FRAMEWORK_HANDLER,
    HANDLERS,
    RUNTIME_HANDLERS,
    fixture_dev,
    fixture_prod,
    fixture_stage,
)
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage

from agentq.config import env_name
from agentq.resources import (
    ARTIFACTS_PREFIX,
    DISPATCHER_RULE,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
    SAVE_EVENT_RULE,
    TASK_QUEUE,
)

pytestmark = pytest.mark.timeout(600)


# -- infrastructure ------------------------------------------------------------------------


def test_infra_task_queue_redrives_to_the_dlq_after_max_receives(stage: SynthesizedStage) -> None:
    template = stage.templates["infrastructure"]
    names = stage.settings.names
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
            "TableName": stage.settings.names.events_table,
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
    settings = stage.settings
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
        assert stage.settings.names.local_bucket not in text


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
        assert variables[env_name("stage")] == stage.settings.name
        if function["Handler"] in RUNTIME_HANDLERS:
            assert env_name("table_name") in variables
        assert "LoggingConfig" in function  # its own log group, with retention
    # One code asset for every function.
    keys = {json.dumps(f["Code"]["S3Key"]) for f in functions}
    assert len(keys) == 1


def test_infra_rules_use_the_shared_patterns(stage: SynthesizedStage) -> None:
    app_name = stage.settings.app_name
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
            "BatchSize": stage.settings.dlq_batch_size,
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
