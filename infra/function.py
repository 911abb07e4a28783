"""AgentqFunction: one agentq Lambda with its own role, log group and shared code asset.

Each function gets a role of its own holding only inline statements (no AWS managed
policy: `AWSLambdaBasicExecutionRole` would grant logs on every group) and a log group
with the stage's retention, created before the function so Lambda never makes an
unbounded one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.config import env_name
from infra.assets import LAMBDA_ARCHITECTURE, LAMBDA_RUNTIME
from infra.nag import acknowledge
from infra.stages import StageSettings


class AgentqFunction(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        code: lambda_.Code,
        handler: str,
        description: str,
        environment: Mapping[str, str],
        statements: Sequence[iam.PolicyStatement] = (),
        timeout: Duration | None = None,
        event_driven: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        # EventBridge invokes asynchronously: after Lambda's own retries a failed event
        # would be dropped. Event-driven functions keep such events in a queue of their
        # own (the rule target sends undeliverable ones there too) for inspection/redrive.
        self.failed_events: sqs.Queue | None = None
        if event_driven:
            self.failed_events = sqs.Queue(
                self,
                "FailedEvents",
                retention_period=Duration.days(14),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                removal_policy=settings.removal_policy,
            )
            acknowledge(
                self.failed_events,
                "SQS3",
                "This queue is itself a dead-letter queue: it keeps events the function "
                "failed on (and undeliverable ones) for inspection and redrive",
            )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=settings.log_retention,
            removal_policy=settings.removal_policy,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{settings.names.prefix} {construct_id}: {description}",
        )
        self.log_group.grant_write(self.role)
        for statement in statements:
            self.role.add_to_principal_policy(statement)
        service = handler.split(".")[1] if "." in handler else handler
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            code=code,
            handler=handler,
            description=description,
            role=self.role,
            log_group=self.log_group,
            memory_size=settings.lambda_memory_mib,
            timeout=timeout or Duration.seconds(30),
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=self.failed_events,
            environment={
                env_name("app_name"): settings.app_name,
                env_name("stage"): settings.name,
                env_name("log_level"): "INFO",
                # Powertools' own variable (not agentq's Settings): names logs, traces, metrics.
                "POWERTOOLS_SERVICE_NAME": service,
                **environment,
            },
        )
        # CDK makes the function depend on the role it already references by GetAtt;
        # cfn-lint (W3005) flags the duplicate, so keep only the policy dependency.
        default_policy = self.role.node.find_child("DefaultPolicy").node.default_child
        function_resource = self.function.node.default_child
        assert isinstance(default_policy, cdk.CfnElement)
        assert isinstance(function_resource, cdk.CfnResource)
        function_resource.add_override(
            "DependsOn", [cdk.Stack.of(self).get_logical_id(default_policy)]
        )
        acknowledge(
            self.role,
            "IAM5",
            "X-Ray's PutTraceSegments/PutTelemetryRecords support no resource-level "
            "permissions; AWS documents Resource '*' as the only option",
            applies_to="Resource::*",
        )
