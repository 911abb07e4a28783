"""AgentqFunction.subscribe: where the rule is made, and who may subscribe (no synth)."""

from __future__ import annotations

import os

import pytest

# Before jsii starts (first aws_cdk import): Node 20's end-of-life banner is noise here.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_lambda as lambda_

from agentq.resources import SAVE_EVENT_RULE
from infra.function import AgentqFunction
from infra.stages import stage_settings

pytestmark = pytest.mark.timeout(120)


def _function(stack: cdk.Stack, construct_id: str, *, event_driven: bool) -> AgentqFunction:
    return AgentqFunction(
        stack,
        construct_id,
        settings=stage_settings("dev"),
        code=lambda_.Code.from_inline("def handler(event, context): pass"),
        handler="index.handler",
        description="a function for subscription tests",
        environment={},
        event_driven=event_driven,
    )


def test_infra_function_subscribes_in_the_callers_scope_with_its_failed_events_queue() -> None:
    stack = cdk.Stack(cdk.App(), "agentq-test")
    bus = events.EventBus(stack, "Bus")
    function = _function(stack, "SaveEvent", event_driven=True)

    rule = function.subscribe(stack, "SaveEventRule", rule=SAVE_EVENT_RULE, bus=bus)

    # A named rule keeps its logical ID only while its place in the tree stays put.
    assert rule.node.scope is stack
    assert rule.node.id == "SaveEventRule"
    resource = rule.node.default_child
    assert isinstance(resource, events.CfnRule)
    assert function.failed_events is not None
    [target] = stack.resolve(resource.targets)
    assert target["deadLetterConfig"]["arn"] == stack.resolve(function.failed_events.queue_arn)


def test_infra_function_without_failed_events_queue_refuses_to_subscribe() -> None:
    stack = cdk.Stack(cdk.App(), "agentq-test")
    bus = events.EventBus(stack, "Bus")
    function = _function(stack, "Plain", event_driven=False)

    with pytest.raises(ValueError, match="event_driven"):
        function.subscribe(stack, "Rule", rule=SAVE_EVENT_RULE, bus=bus)
    assert stack.node.try_find_child("Rule") is None


@pytest.mark.parametrize("enabled", [True, False])
def test_infra_function_schedule_runs_it_at_the_rate_without_retries(enabled: bool) -> None:
    stack = cdk.Stack(cdk.App(), "agentq-test")
    function = _function(stack, "Sweep", event_driven=False)

    rule = function.schedule(stack, "Schedule", what="sweep", rate_minutes=7, enabled=enabled)

    assert rule.node.scope is stack and rule.node.id == "Schedule"
    resource = rule.node.default_child
    assert isinstance(resource, events.CfnRule)
    assert resource.schedule_expression == "rate(7 minutes)"
    assert resource.description == "sweep every 7 min"
    assert resource.state == ("ENABLED" if enabled else "DISABLED")
    [target] = stack.resolve(resource.targets)
    assert target["arn"] == stack.resolve(function.function.function_arn)
    # A missed run is left to the next one: a retry would only overlap it.
    assert target["retryPolicy"] == {"maximumRetryAttempts": 0}
