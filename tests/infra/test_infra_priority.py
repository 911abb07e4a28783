"""Priority tiers in the CDK stacks: one queue per tier like the task queue, every
component that sends or receives pointed at all of them, alarms per tier."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match
from infra_synth import SynthesizedStage, synthesized

from agentq.config import Settings
from agentq.resources import DEFAULT_TIER, PRIORITY_TIERS, TASK_QUEUE


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("dev", tmp_path_factory)


def test_every_tier_has_a_queue_like_the_task_queue_redriving_into_the_one_dlq(
    dev: SynthesizedStage,
) -> None:
    template = dev.templates["infrastructure"]
    names = dev.settings.names
    queues = names.tier_queues()
    assert list(queues) == list(PRIORITY_TIERS) and queues[DEFAULT_TIER] == names.task_queue
    for name in queues.values():
        template.has_resource_properties(
            "AWS::SQS::Queue",
            {
                "QueueName": name,
                "VisibilityTimeout": TASK_QUEUE.visibility_timeout_s,
                "SqsManagedSseEnabled": True,
                "RedrivePolicy": {
                    "deadLetterTargetArn": {
                        "Fn::GetAtt": [Match.string_like_regexp("DeadLetter"), "Arn"]
                    },
                    "maxReceiveCount": TASK_QUEUE.max_receive_count,
                },
            },
        )
    # The default tier keeps the task queue's construct: no replacement on upgrade.
    logical = [k for k in template.find_resources("AWS::SQS::Queue") if k.startswith("TaskQueue")]
    assert any(k.startswith("TaskQueue") and "high" not in k and "low" not in k for k in logical)


def test_worker_dispatcher_and_api_get_every_tier_queue_url(dev: SynthesizedStage) -> None:
    for stack in ("worker", "dispatcher", "producer-api"):
        text = json.dumps(dev.templates[stack].to_json())
        assert "SQS_QUEUE_URLS" in text, stack


def test_the_worker_may_receive_from_and_forward_to_every_tier(dev: SynthesizedStage) -> None:
    policies = dev.templates["worker"].find_resources("AWS::IAM::Policy")
    statements = [
        statement
        for policy in policies.values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    receive = [s for s in statements if "sqs:ReceiveMessage" in s["Action"]]
    assert receive and len(receive[0]["Resource"]) == len(PRIORITY_TIERS)
    # Forwarding a message to its tier's queue sends there (CDK may merge the statements).
    assert any(
        "sqs:SendMessage" in s["Action"] and len(s["Resource"]) == len(PRIORITY_TIERS)
        for s in statements
    )


def test_each_tier_has_an_oldest_message_alarm(dev: SynthesizedStage) -> None:
    alarms = dev.templates["monitoring"].find_resources("AWS::CloudWatch::Alarm")
    names = json.dumps(alarms)
    for tier in PRIORITY_TIERS:
        if tier != DEFAULT_TIER:
            assert f"oldest-{tier}-message" in names, tier
    assert "oldest-task-message" in names


def test_the_deployed_tier_urls_parse_as_configuration() -> None:
    urls = ",".join(f"{t}=https://sqs.eu-west-1.amazonaws.com/1/q-{t}" for t in PRIORITY_TIERS)
    settings = Settings.from_env({"SQS_QUEUE_URLS": urls})
    assert list(settings.tier_queue_urls()) == list(PRIORITY_TIERS)
