"""The synthesized policy statements of each local component's role, for the
IAM-enforced local stack (agentq.local.iam runs this module in a child process, so
jsii and node stay out of its caller and `agentq` never imports `infra`). What to
extract comes on stdin from that caller, so infra imports no local emulation either.

    python -m infra.local_policies < request.json   # JSON: component -> statements
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
Statement = dict[str, Any]


@dataclass(frozen=True)
class PolicyRequest:
    """What agentq.local.iam asks for (its COMPONENTS, NAMED_RESOURCES, SYNTH_STAGE and
    UNRESOLVED, as JSON on stdin)."""

    components: Mapping[str, str]  # component -> its role's attribute path in the app
    named_resources: tuple[str, ...]  # ResourceNames attributes kept as tokens
    stage: str
    unresolved: str  # the ARN prefix of what the resolver cannot name

    @classmethod
    def from_json(cls, text: str) -> PolicyRequest:
        data = json.loads(text)
        return cls(components=dict(data["components"]),
                   named_resources=tuple(data["namedResources"]), stage=str(data["stage"]),
                   unresolved=str(data["unresolved"]))  # fmt: skip


class _Resolver:
    def __init__(
        self,
        templates: Mapping[str, dict[str, Any]],
        names: Any,
        bucket_ids: set[str],
        *,
        named_resources: tuple[str, ...],
        unresolved: str,
    ):
        self._templates = templates
        self._unresolved = unresolved
        self._exports = {
            str(output["Export"]["Name"]): (stack, output["Value"])
            for stack, template in templates.items()
            for output in template.get("Outputs", {}).values()
            if isinstance(output.get("Export", {}).get("Name"), str)
        }
        self._tokens = {getattr(names, attr): f"${{agentq:{attr}}}" for attr in named_resources}
        # Every priority tier's queue (the default tier's is the task queue itself).
        for tier, queue in names.tier_queues().items():
            self._tokens.setdefault(queue, f"${{agentq:tier:{tier}}}")
        self._buckets = bucket_ids

    def resolve(self, stack: str, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return [self.resolve(stack, item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
            return {key: self.resolve(stack, item) for key, item in value.items()}
        ((function, argument),) = value.items()
        if function == "Fn::ImportValue":
            exporter, exported = self._exports[str(argument)]
            return self.resolve(exporter, exported)
        if function == "Fn::Join":
            separator, parts = argument
            return str(separator).join(str(self.resolve(stack, p)) for p in parts)
        if function == "Ref":
            return self._ref(stack, str(argument))
        if function == "Fn::Sub" and isinstance(argument, str):
            # Pseudo parameters only (the CDK bootstrap's asset bucket and repository).
            return re.sub(r"\$\{([^}!]+)\}", lambda m: self._ref(stack, m.group(1)), argument)
        if function == "Fn::GetAtt":
            return (
                self._arn(stack, str(argument[0]))
                if argument[1] == "Arn"
                else self._missing(stack, str(argument[0]))
            )
        return self._missing(stack, function)

    def _ref(self, stack: str, name: str) -> str:
        pseudo = {"AWS::Region": "${AWS::Region}", "AWS::AccountId": "${AWS::AccountId}",
                  "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
        return pseudo.get(name) or self._missing(stack, name)

    def _arn(self, stack: str, logical_id: str) -> str:
        resource = self._templates[stack]["Resources"].get(logical_id, {})
        kind, props = resource.get("Type"), resource.get("Properties", {})
        region, account = "${AWS::Region}", "${AWS::AccountId}"
        if kind == "AWS::SQS::Queue" and props.get("QueueName") in self._tokens:
            return f"arn:aws:sqs:{region}:{account}:{self._tokens[props['QueueName']]}"
        if kind == "AWS::DynamoDB::Table" and props.get("TableName") in self._tokens:
            return f"arn:aws:dynamodb:{region}:{account}:table/{self._tokens[props['TableName']]}"
        if kind == "AWS::Events::EventBus" and props.get("Name") in self._tokens:
            return f"arn:aws:events:{region}:{account}:event-bus/{self._tokens[props['Name']]}"
        if kind == "AWS::S3::Bucket" and f"{stack}/{logical_id}" in self._buckets:
            return "arn:aws:s3:::${agentq:bucket}"
        return self._missing(stack, logical_id)

    def _missing(self, stack: str, what: str) -> str:
        return f"{self._unresolved}:{stack}/{what}"


def _synthesize(request: PolicyRequest) -> dict[str, list[Statement]]:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    import aws_cdk as cdk

    from infra.app import build_app

    context = json.loads((REPO_ROOT / "cdk.json").read_text()).get("context", {})
    with tempfile.TemporaryDirectory(prefix="agentq-iam-synth-") as outdir:
        app = cdk.App(outdir=outdir, context={**context, "stage": request.stage})
        stacks = build_app(app, nag=False)
        assembly = app.synth()
        templates = {s.stack_name: dict(s.template) for s in assembly.stacks}
    bucket = stacks.infrastructure.bucket
    bucket_id = (
        f"{bucket.stack.stack_name}/{bucket.stack.get_logical_id(bucket.node.default_child)}"  # type: ignore[arg-type]
    )
    resolver = _Resolver(templates, stacks.settings.names, {bucket_id},
                         named_resources=request.named_resources,
                         unresolved=request.unresolved)  # fmt: skip
    policies: dict[str, list[Statement]] = {}
    for component, path in request.components.items():
        construct: Any = stacks
        for attribute in path.split("."):
            construct = getattr(construct, attribute)
        stack = construct.stack
        logical_id = stack.get_logical_id(construct.node.default_child)
        resources = templates[stack.stack_name]["Resources"]
        statements: list[Statement] = []
        for resource in resources.values():
            props = resource.get("Properties", {})
            attached = resource["Type"] == "AWS::IAM::Policy" and {"Ref": logical_id} in props.get(
                "Roles", []
            )
            if attached or (
                resource is resources[logical_id] and resource["Type"] == "AWS::IAM::ManagedPolicy"
            ):
                for statement in props["PolicyDocument"]["Statement"]:
                    statements.append(resolver.resolve(stack.stack_name, statement))
        policies[component] = statements
    return policies


def main() -> None:
    json.dump(_synthesize(PolicyRequest.from_json(sys.stdin.read())), sys.stdout)


if __name__ == "__main__":
    main()
