"""A deploy rehearsal: the rules CloudFormation and ECS enforce at create and update time
that cfn-lint does not check, applied to synthesized templates.

`python -m infra.rehearsal cdk.out/prod` (run by `make synth` for each stage) reads every
`*.template.json` in the directories and fails, naming the stack and resource, on each
rule of docs/deploy.md ("1. Check the templates"): capacity-provider ordering, an autoscaled
DesiredCount, a secret read in the template that creates it, a custom resource's
ServiceTimeout, an alarm that notifies nobody (`--unsubscribed-alarms report` for dev).
Retained resources with a fixed name are reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

Template = Mapping[str, Any]
Severity = Literal["error", "report"]

# The property that fixes a resource's physical name, per resource type.
NAME_PROPERTIES: Final = {
    "AWS::DynamoDB::Table": "TableName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::S3::Bucket": "BucketName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::SecretsManager::Secret": "Name",
    "AWS::Events::EventBus": "Name",
    "AWS::KMS::Alias": "AliasName",
}


@dataclass(frozen=True)
class Finding:
    rule: str
    stack: str
    logical_id: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.stack}/{self.logical_id}: {self.message} [{self.rule}]"


def _resources(template: Template, *types: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for logical_id, resource in template.get("Resources", {}).items():
        kind = str(resource.get("Type", ""))
        if not types or kind in types or ("Custom::*" in types and kind.startswith("Custom::")):
            yield logical_id, resource


def _references(value: Any) -> set[str]:
    """Logical ids a property value points at (Ref, Fn::GetAtt), however deeply nested."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                target = inner[0] if isinstance(inner, list) else str(inner).split(".")[0]
                found.add(str(target))
            else:
                found |= _references(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _references(inner)
    return found


def _depends_on(template: Template, logical_id: str) -> set[str]:
    """Everything `logical_id` is created after: DependsOn and references, transitively."""
    resources = template.get("Resources", {})
    seen: set[str] = set()
    pending = [logical_id]
    while pending:
        resource = resources.get(pending.pop(), {})
        depends = resource.get("DependsOn", [])
        direct = {depends} if isinstance(depends, str) else set(depends)
        direct |= _references(resource.get("Properties", {}))
        for target in direct - seen:
            if target in resources:
                seen.add(target)
                pending.append(target)
    return seen


def capacity_provider_associations(stack: str, template: Template) -> Iterator[Finding]:
    associations = {
        logical_id: resource["Properties"]
        for logical_id, resource in _resources(
            template, "AWS::ECS::ClusterCapacityProviderAssociations"
        )
    }
    for logical_id, service in _resources(template, "AWS::ECS::Service"):
        properties = service.get("Properties", {})
        strategy = properties.get("CapacityProviderStrategy") or []
        cluster = _references(properties.get("Cluster"))
        if not strategy or not cluster & set(template.get("Resources", {})):
            continue  # no providers named, or a cluster from elsewhere (already associated)
        before = _depends_on(template, logical_id)
        matching = [a for a, p in associations.items() if _references(p.get("Cluster")) == cluster]
        if not any(a in before for a in matching):
            yield Finding(
                "capacity-provider-association",
                stack,
                logical_id,
                "uses capacity providers but does not depend on its cluster's "
                f"ClusterCapacityProviderAssociations ({', '.join(matching) or 'none'}): "
                "ECS can reject the service on first create",
            )


def _scaled_services(template: Template) -> set[str]:
    return {
        ref
        for _, target in _resources(template, "AWS::ApplicationAutoScaling::ScalableTarget")
        if target.get("Properties", {}).get("ScalableDimension") == "ecs:service:DesiredCount"
        for ref in _references(target["Properties"].get("ResourceId"))
    }


def scaled_desired_count(stack: str, template: Template) -> Iterator[Finding]:
    scaled = _scaled_services(template)
    for logical_id, service in _resources(template, "AWS::ECS::Service"):
        if logical_id in scaled and "DesiredCount" in service.get("Properties", {}):
            yield Finding(
                "scaled-desired-count",
                stack,
                logical_id,
                "is autoscaled but sets DesiredCount: every stack update resets the "
                "scaled task count to it",
            )


def secrets_before_service(stack: str, template: Template) -> Iterator[Finding]:
    resources = template.get("Resources", {})
    created_here = {i for i, _ in _resources(template, "AWS::SecretsManager::Secret")}
    for logical_id, service in _resources(template, "AWS::ECS::Service"):
        properties = service.get("Properties", {})
        if properties.get("DesiredCount") == 0:
            continue  # starts no task on create
        for definition_id in _references(properties.get("TaskDefinition")):
            definition = resources.get(definition_id, {}).get("Properties", {})
            for container in definition.get("ContainerDefinitions", []):
                for secret in container.get("Secrets", []):
                    same_deploy = _references(secret.get("ValueFrom")) & created_here
                    if same_deploy:
                        yield Finding(
                            "secret-before-service",
                            stack,
                            logical_id,
                            f"runs a task reading {secret.get('Name')} from "
                            f"{', '.join(sorted(same_deploy))}, created by the same deploy "
                            "with a placeholder: no one can set it before the first task",
                        )


def custom_resource_timeouts(stack: str, template: Template) -> Iterator[Finding]:
    resources = template.get("Resources", {})
    for logical_id, resource in _resources(
        template, "AWS::CloudFormation::CustomResource", "Custom::*"
    ):
        properties = resource.get("Properties", {})
        timeout = properties.get("ServiceTimeout")
        if timeout is None:
            yield Finding(
                "custom-resource-timeout",
                stack,
                logical_id,
                "has no ServiceTimeout: a handler that never answers holds the deploy "
                "for an hour before CloudFormation fails it",
            )
            continue
        for handler_id in _references(properties.get("ServiceToken")):
            handler = resources.get(handler_id, {})
            handler_timeout = handler.get("Properties", {}).get("Timeout", 3)
            if handler.get("Type") == "AWS::Lambda::Function" and int(timeout) < int(
                handler_timeout
            ):
                yield Finding(
                    "custom-resource-timeout",
                    stack,
                    logical_id,
                    f"ServiceTimeout {timeout} s is shorter than its handler's "
                    f"{handler_timeout} s: CloudFormation fails a change that still completes",
                )


def _subscribed_topics(template: Template) -> set[str]:
    subscribed = {
        ref
        for _, resource in _resources(template, "AWS::SNS::Subscription")
        for ref in _references(resource.get("Properties", {}).get("TopicArn"))
    }
    subscribed |= {
        ref
        for _, resource in _resources(template, "AWS::Chatbot::SlackChannelConfiguration")
        for ref in _references(resource.get("Properties", {}).get("SnsTopicArns"))
    }
    subscribed |= {
        logical_id
        for logical_id, topic in _resources(template, "AWS::SNS::Topic")
        if topic.get("Properties", {}).get("Subscription")
    }
    return subscribed


def alarms_reach_subscribers(
    stack: str, template: Template, unsubscribed: Severity = "error"
) -> Iterator[Finding]:
    """Every alarm acts: on a topic with a subscriber, or on a scaling policy."""
    subscribed = _subscribed_topics(template)
    topics = {i for i, _ in _resources(template, "AWS::SNS::Topic")}
    for logical_id, alarm in _resources(template, "AWS::CloudWatch::Alarm"):
        actions = alarm.get("Properties", {}).get("AlarmActions") or []
        silent = _references(actions) & topics - subscribed
        if not actions:
            yield Finding("alarm-subscriber", stack, logical_id, "notifies nothing")
        elif silent:
            yield Finding(
                "alarm-subscriber",
                stack,
                logical_id,
                f"notifies {', '.join(sorted(silent))}, which has no subscriber (e-mail, "
                "Slack, or any other): the alarm reaches nobody",
                severity=unsubscribed,
            )


def retained_fixed_names(stack: str, template: Template) -> Iterator[Finding]:
    for logical_id, resource in _resources(template, *NAME_PROPERTIES):
        name = resource.get("Properties", {}).get(NAME_PROPERTIES[resource["Type"]])
        retained = resource.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate")
        if retained and name is not None:
            shown = name if isinstance(name, str) else json.dumps(name)
            yield Finding(
                "retained-fixed-name",
                stack,
                logical_id,
                f"{resource['Type']} {shown} is retained on destroy: delete or import it "
                "before deploying this stage again",
                severity="report",
            )


RULES: Final[tuple[Callable[[str, Template], Iterator[Finding]], ...]] = (
    capacity_provider_associations,
    scaled_desired_count,
    secrets_before_service,
    custom_resource_timeouts,
    retained_fixed_names,
)


def rehearse(
    templates: Mapping[str, Template], *, unsubscribed_alarms: Severity = "error"
) -> list[Finding]:
    """Every finding over stack name -> template, errors first. `unsubscribed_alarms`
    is "report" for a stage allowed to synthesize without alarm subscribers (dev)."""
    findings = [f for stack, t in templates.items() for rule in RULES for f in rule(stack, t)]
    findings += [
        f
        for stack, template in templates.items()
        for f in alarms_reach_subscribers(stack, template, unsubscribed_alarms)
    ]
    return sorted(findings, key=lambda f: (f.severity != "error", f.stack, f.logical_id))


def load_templates(directories: Sequence[Path]) -> dict[str, Template]:
    templates: dict[str, Template] = {}
    for directory in directories:
        for path in sorted(directory.glob("*.template.json")):
            templates[path.name.removesuffix(".template.json")] = json.loads(path.read_text())
    return templates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.rehearsal", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("directories", nargs="+", type=Path, help="cdk synth --output dirs")
    parser.add_argument(
        "--unsubscribed-alarms",
        choices=("error", "report"),
        default="error",
        help="report instead of fail alarms that reach nobody (a dev stage may have none)",
    )
    args = parser.parse_args(argv)
    templates = load_templates(args.directories)
    if not templates:
        print("rehearsal: no *.template.json found: run `make synth` first", file=sys.stderr)
        return 2
    findings = rehearse(templates, unsubscribed_alarms=args.unsubscribed_alarms)
    for finding in findings:
        print(finding)
    errors = sum(f.severity == "error" for f in findings)
    print(f"rehearsal: {len(templates)} templates, {errors} errors, "
          f"{len(findings) - errors} reported")  # fmt: skip
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
