"""IAM statements scoped to specific ARNs (tables with named indexes, bucket prefixes).

CDK's `grant_*` helpers give `table/index/*` and whole-bucket object access; agentq
knows its index names and key prefixes, so its roles name them instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from agentq.resources import TableSpec
from infra.nag import acknowledge


def leading_keys(*prefixes: str) -> dict[str, Any]:
    """A condition that lets an item call through only on partitions with these prefixes
    (every item of a transaction or batch is checked as its own call)."""
    return {
        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{prefix}*" for prefix in prefixes]}
    }


def table_statement(
    table: dynamodb.ITable, spec: TableSpec, actions: Sequence[str], *, indexes: bool = False
) -> iam.PolicyStatement:
    """`dynamodb:<action>` on the table (and each of its named indexes when `indexes`)."""
    resources = [table.table_arn]
    if indexes:
        resources += [f"{table.table_arn}/index/{index.name}" for index in spec.indexes]
    return iam.PolicyStatement(
        actions=[f"dynamodb:{action}" for action in actions], resources=resources
    )


def start_up_checks_statement(bus: events.IEventBus, bucket: s3.IBucket) -> iam.PolicyStatement:
    """The worker's start-up checks (worker/preflight.py): metadata reads of its own bus
    and bucket. HeadBucket would need s3:ListBucket, a listing of every tenant's objects;
    GetBucketLocation tells as well whether the bucket is there."""
    return iam.PolicyStatement(
        actions=["events:DescribeEventBus", "s3:GetBucketLocation"],
        resources=[bus.event_bus_arn, bucket.bucket_arn],
    )


def grant_objects(
    role: iam.Role,
    bucket: s3.Bucket,
    prefixes: Sequence[str],
    actions: Sequence[str],
    construct_id: str = "ObjectPrefixes",
) -> iam.Policy:
    """`s3:<action>` on objects under the given key prefixes only, as a policy of its own.

    Object keys are per task, so each resource ends in a wildcard, which cdk-nag flags
    by the rendered ARN. Each finding is acknowledged by exactly that ARN (so a new,
    broader wildcard still fails the build); across stacks the ARN renders as the
    export name, which `export_value` returns before synthesis.
    """
    role_stack, bucket_stack = cdk.Stack.of(role), cdk.Stack.of(bucket)
    if role_stack is bucket_stack:
        bucket_arn = bucket.bucket_arn
        logical_id = bucket_stack.get_logical_id(cast(cdk.CfnElement, bucket.node.default_child))
        rendered = f"<{logical_id}.Arn>"
    else:
        bucket_arn = bucket_stack.export_value(bucket.bucket_arn)
        rendered = str(role_stack.resolve(bucket_arn)["Fn::ImportValue"])
    scope = role.node.scope or role
    policy = iam.Policy(
        cast(Construct, scope),
        construct_id,
        statements=[
            iam.PolicyStatement(
                actions=[f"s3:{action}" for action in actions],
                resources=[f"{bucket_arn}/{prefix}*" for prefix in prefixes],
            )
        ],
    )
    policy.attach_to_role(role)
    for prefix in prefixes:
        acknowledge(
            policy,
            "IAM5",
            f"Only s3:{'/'.join(actions)} on objects under {prefix} of the agentq bucket; "
            "object keys are per task, so the key part must be a wildcard",
            applies_to=f"Resource::{rendered}/{prefix}*",
        )
    return policy


class SecretValueOnly(ecs.Secret):
    """A Secrets Manager secret injected into a container, its execution role granted
    `secretsmanager:GetSecretValue` alone: ECS reads the value at task start and nothing
    more, while `ecs.Secret.from_secrets_manager` grants `DescribeSecret` too. Whole
    secrets only (no JSON field), under the default AWS-managed key."""

    def __init__(self, secret: secretsmanager.ISecret) -> None:
        super().__init__()
        self._secret = secret

    @property
    def arn(self) -> str:
        return self._secret.secret_arn

    @property
    def has_field(self) -> bool:
        return False

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["secretsmanager:GetSecretValue"],
            resource_arns=[self._secret.secret_arn],
        )
