"""'Task Requested' events reach the task queue with their tenant as MessageGroupId (SQS
fair queues), in the synthesized template; the local stack: tests/local/test_rule_eventbridge_groups.py."""

from __future__ import annotations

from typing import Any

from _infra_stacks_common import fixture_dev  # noqa: F401  (the `dev` fixture)
from infra_synth import SynthesizedStage

from agentq.resources import RULES, TASK_REQUESTED_DEFAULT_TENANT_RULE, TASK_REQUESTED_RULE


def _rule(stage: SynthesizedStage, name: str) -> dict[str, Any]:
    rules = stage.templates["infrastructure"].find_resources("AWS::Events::Rule")
    wanted = f"{stage.settings.names.prefix}-{name}"
    [properties] = [
        r["Properties"] for r in rules.values() if r["Properties"].get("Name") == wanted
    ]
    return dict(properties)


def test_infra_a_task_requested_event_naming_its_tenant_is_grouped_by_it(
    dev: SynthesizedStage,
) -> None:
    [target] = _rule(dev, TASK_REQUESTED_RULE.name)["Targets"]
    # An EventBridge dynamic path: the whole value a JSON path into the event.
    assert target["SqsParameters"] == {"MessageGroupId": "$.detail.tenant"}
    assert _rule(dev, TASK_REQUESTED_RULE.name)["EventPattern"]["detail"] == {
        "tenant": [{"exists": True}]
    }


def test_infra_an_event_naming_no_tenant_has_a_rule_of_its_own_without_a_group(
    dev: SynthesizedStage,
) -> None:
    """A path that resolves to nothing has no documented outcome: such events match only
    the other rule, which sets no group, so every event is delivered exactly once."""
    rule = _rule(dev, TASK_REQUESTED_DEFAULT_TENANT_RULE.name)
    [target] = rule["Targets"]
    assert "SqsParameters" not in target
    assert rule["EventPattern"]["detail"] == {"tenant": [{"exists": False}]}
    assert target["Arn"] == _rule(dev, TASK_REQUESTED_RULE.name)["Targets"][0]["Arn"]
    assert [r.name for r in RULES if r.target == "task-queue"] == [
        TASK_REQUESTED_RULE.name, TASK_REQUESTED_DEFAULT_TENANT_RULE.name]  # fmt: skip
