"""The local stack (moto) and the synthesized templates agree on every setting they share.

Both read agentq.resources; this test reads what each actually produced: the attributes
moto reports for the provisioned stage, and the CloudFormation properties of dev.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack
from infra_synth import SynthesizedStage, synthesized

from agentq.resources import RULES

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("dev", tmp_path_factory)


def _one(stage: SynthesizedStage, stack: str, resource_type: str, **match: Any) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        r["Properties"]
        for r in stage.resources(stack, resource_type).values()
        if all(r["Properties"].get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (resource_type, match, len(found))
    return found[0]


def _queue_attributes(stack: Stack, url: str) -> dict[str, str]:
    return dict(stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])


def test_infra_queues_agree(stack: Stack, dev: SynthesizedStage) -> None:
    names = dev.settings.names
    cloud = _one(dev, "infrastructure", "AWS::SQS::Queue", QueueName=names.task_queue)
    local = _queue_attributes(stack, stack.resources.queue_url)
    assert int(local["VisibilityTimeout"]) == cloud["VisibilityTimeout"]
    assert int(local["ReceiveMessageWaitTimeSeconds"]) == cloud["ReceiveMessageWaitTimeSeconds"]
    assert int(local["MessageRetentionPeriod"]) == cloud["MessageRetentionPeriod"]
    local_redrive = json.loads(local["RedrivePolicy"])
    assert local_redrive["maxReceiveCount"] == cloud["RedrivePolicy"]["maxReceiveCount"]
    assert local_redrive["deadLetterTargetArn"] == stack.resources.dlq_arn

    cloud_dlq = _one(dev, "infrastructure", "AWS::SQS::Queue", QueueName=names.dead_letter_queue)
    local_dlq = _queue_attributes(stack, stack.resources.dlq_url)
    assert int(local_dlq["MessageRetentionPeriod"]) == cloud_dlq["MessageRetentionPeriod"]


def _local_table(stack: Stack, name: str) -> dict[str, Any]:
    return dict(stack.dynamodb.describe_table(TableName=name)["Table"])


def _key_schema(schema: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(k["AttributeName"], k["KeyType"]) for k in schema]


def test_infra_tables_agree(stack: Stack, dev: SynthesizedStage) -> None:
    names = dev.settings.names
    pairs = [
        (stack.resources.table_name, names.events_table),
        (stack.resources.definitions_table, names.definitions_table),
    ]
    for local_name, cloud_name in pairs:
        cloud = _one(dev, "infrastructure", "AWS::DynamoDB::Table", TableName=cloud_name)
        local = _local_table(stack, local_name)
        assert _key_schema(local["KeySchema"]) == _key_schema(cloud["KeySchema"])
        assert local["BillingModeSummary"]["BillingMode"] == cloud["BillingMode"]
        assert sorted(
            (a["AttributeName"], a["AttributeType"]) for a in local["AttributeDefinitions"]
        ) == sorted((a["AttributeName"], a["AttributeType"]) for a in cloud["AttributeDefinitions"])
        local_indexes = {
            i["IndexName"]: (_key_schema(i["KeySchema"]), i["Projection"]["ProjectionType"])
            for i in local.get("GlobalSecondaryIndexes", [])
        }
        cloud_indexes = {
            i["IndexName"]: (_key_schema(i["KeySchema"]), i["Projection"]["ProjectionType"])
            for i in cloud.get("GlobalSecondaryIndexes", [])
        }
        assert local_indexes == cloud_indexes
        ttl = stack.dynamodb.describe_time_to_live(TableName=local_name)["TimeToLiveDescription"]
        cloud_ttl = cloud.get("TimeToLiveSpecification")
        if cloud_ttl:
            assert ttl["TimeToLiveStatus"] == "ENABLED"
            assert ttl["AttributeName"] == cloud_ttl["AttributeName"]
        else:
            assert ttl["TimeToLiveStatus"] == "DISABLED"


def test_infra_rules_agree(stack: Stack, dev: SynthesizedStage) -> None:
    local_prefix = stack.resources.names.prefix
    local_rules = {
        rule["Name"].removeprefix(f"{local_prefix}-"): json.loads(rule["EventPattern"])
        for rule in stack.events.list_rules(EventBusName=stack.resources.bus_name)["Rules"]
    }
    cloud_prefix = dev.settings.names.prefix
    cloud_rules = {
        rule["Properties"]["Name"].removeprefix(f"{cloud_prefix}-"): rule["Properties"][
            "EventPattern"
        ]
        for _, rule in dev.all_resources("AWS::Events::Rule")
        if "EventPattern" in rule["Properties"]
    }
    assert set(local_rules) == set(cloud_rules) == {rule.name for rule in RULES}
    for name, pattern in local_rules.items():
        assert pattern == cloud_rules[name], name
