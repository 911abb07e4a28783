"""Least privilege on the local stack: each component signs with a user of its own
whose policy is exactly what the CDK templates grant that component's role.

    AGENTQ_LOCAL_IAM=enforce agentq local up      (or LocalStackOptions(iam=True))

1. `synthesized_policies()` synthesizes the app (the `dev` stage, no cdk-nag) in a
   child process and reads, for each component in `COMPONENTS`, every statement of
   every policy attached to its role (the producer: the `ProducerPolicy` managed
   policy). CloudFormation intrinsics are resolved to stage-independent tokens:
   the stage's queues, tables, bus and artifacts bucket become `${agentq:<name>}`,
   region and account `${AWS::Region}`/`${AWS::AccountId}`. A resource that does not
   exist locally (log groups, the failed-event queues, secrets, ECS tasks) becomes an
   ARN naming it under `arn:aws:agentq-local-unresolved:::...`, which matches nothing, so
   such a statement grants nothing locally. Only a literal `*` in a template stays `*`.
   Synthesis costs tens of seconds, so its result is cached by the content of
   `infra/`, `agentq/resources.py`, `agentq/config.py`, `app.py` and `cdk.json`.
2. `create_component_users()` fills the tokens with the local resources' ARNs and
   creates one IAM user per component in moto (through the operator's admin key),
   with the statements as its inline policy, and returns each user's access key.

moto's server must run with `--iam` (agentq.local.moto_iam) for any of it to be checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.errors import ConfigError

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
SYNTH_STAGE: Final = "dev"
# Component -> its role in the synthesized stage (the attribute path in StageStacks).
COMPONENTS: Final = {
    "worker": "worker.task_role",
    "save-event": "events.save_event.role",
    "dlq-processor": "events.dlq_processor.role",
    "dispatcher": "dispatcher.handler.role",
    "health-check": "health_check.handler.role",
    "reconciler": "health_check.reconciler.handler.role",
    "producer-api": "producer_api.handler.role",
    "producer": "infrastructure.producer_policy",
}
# ResourceNames attributes that are tokens in the cached statements.
NAMED_RESOURCES: Final = (
    "task_queue",
    "dead_letter_queue",
    "events_table",
    "definitions_table",
    "event_bus",
)
UNRESOLVED: Final = "arn:aws:agentq-local-unresolved::"
_HASHED: Final = (
    "infra",
    "agentq/local/iam.py",
    "agentq/resources.py",
    "agentq/config.py",
    "app.py",
    "cdk.json",
)

Statement = dict[str, Any]


@dataclass(frozen=True)
class Credentials:
    user: str
    access_key_id: str
    secret_access_key: str

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }


# -- synthesis (runs in a child process: jsii and node stay out of the caller) ------------
class _Resolver:
    def __init__(self, templates: Mapping[str, dict[str, Any]], names: Any, bucket_ids: set[str]):
        self._templates = templates
        self._exports = {
            str(output["Export"]["Name"]): (stack, output["Value"])
            for stack, template in templates.items()
            for output in template.get("Outputs", {}).values()
            if isinstance(output.get("Export", {}).get("Name"), str)
        }
        self._tokens = {getattr(names, attr): f"${{agentq:{attr}}}" for attr in NAMED_RESOURCES}
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

    @staticmethod
    def _missing(stack: str, what: str) -> str:
        return f"{UNRESOLVED}:{stack}/{what}"


def _synthesize() -> dict[str, list[Statement]]:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    import aws_cdk as cdk

    from infra.app import build_app

    context = json.loads((REPO_ROOT / "cdk.json").read_text()).get("context", {})
    with tempfile.TemporaryDirectory(prefix="agentq-iam-synth-") as outdir:
        app = cdk.App(outdir=outdir, context={**context, "stage": SYNTH_STAGE})
        stacks = build_app(app, nag=False)
        assembly = app.synth()
        templates = {s.stack_name: dict(s.template) for s in assembly.stacks}
    bucket = stacks.infrastructure.bucket
    bucket_id = (
        f"{bucket.stack.stack_name}/{bucket.stack.get_logical_id(bucket.node.default_child)}"  # type: ignore[arg-type]
    )
    resolver = _Resolver(templates, stacks.settings.names, {bucket_id})
    policies: dict[str, list[Statement]] = {}
    for component, path in COMPONENTS.items():
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


def source_hash() -> str:
    digest = hashlib.sha256()
    for entry in _HASHED:
        path = REPO_ROOT / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(REPO_ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentq"


def synthesized_policies() -> dict[str, list[Statement]]:
    """Each component's synthesized statements, with tokens for local resources (cached)."""
    cache = _cache_dir() / f"iam-policies-{source_hash()}.json"
    if cache.exists():
        cached: dict[str, list[Statement]] = json.loads(cache.read_text())
        return cached
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "agentq.local.iam"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(
            "AGENTQ_LOCAL_IAM", f"could not synthesize the policies: {done.stderr[-2000:]}"
        )
    policies: dict[str, list[Statement]] = json.loads(done.stdout)
    # Written whole, then renamed: a concurrent reader sees no file or a complete one.
    with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(policies, tmp)
    os.replace(tmp.name, cache)
    return policies


# -- the local side ---------------------------------------------------------------------
def local_statements(
    statements: list[Statement], resources: Any, *, region: str, account: str
) -> list[Statement]:
    """Tokens replaced by the local stage's names, region and account."""
    values = {f"${{agentq:{attr}}}": getattr(resources.names, attr) for attr in NAMED_RESOURCES}
    values |= {
        "${agentq:bucket}": resources.bucket,
        "${AWS::Region}": region,
        "${AWS::AccountId}": account,
    }
    text = json.dumps(statements)
    for token, value in values.items():
        text = text.replace(token, value)
    result: list[Statement] = json.loads(text)
    return result


def create_component_users(
    iam: Any,
    resources: Any,
    policies: Mapping[str, list[Statement]],
    *,
    region: str,
    account: str,
    without: Mapping[str, str] | None = None,
) -> dict[str, Credentials]:
    """One IAM user per component holding exactly its statements; `without` maps a
    component to an action its policy must not grant (to prove a test notices)."""
    created: dict[str, Credentials] = {}
    for component, statements in policies.items():
        document = local_statements(statements, resources, region=region, account=account)
        if without and component in without:
            document = _remove_action(document, without[component])
        user = f"{resources.names.prefix}-{component}"
        iam.create_user(UserName=user)
        iam.put_user_policy(
            UserName=user,
            PolicyName="synthesized",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": document}),
        )
        key = iam.create_access_key(UserName=user)["AccessKey"]
        created[component] = Credentials(user, key["AccessKeyId"], key["SecretAccessKey"])
    return created


def _remove_action(statements: list[Statement], action: str) -> list[Statement]:
    kept = []
    found = False
    for statement in statements:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        remaining = [a for a in actions if a != action]
        found = found or len(remaining) < len(actions)
        if remaining:
            kept.append({**statement, "Action": remaining})
    if not found:
        raise ConfigError("AGENTQ_LOCAL_IAM", f"{action} is not granted, so it cannot be removed")
    return kept


def main() -> None:
    json.dump(_synthesize(), sys.stdout)


if __name__ == "__main__":
    main()
