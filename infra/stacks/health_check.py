"""The health check: a scheduled Lambda that reports stuck, overtime and starving tasks
and DLQ depth to Slack. Its schedule and whether it runs at all are stage settings."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from agentq.config import env_name
from agentq.resources import EVENTS_TABLE
from infra.function import AgentqFunction
from infra.nag import acknowledge
from infra.policies import table_statement
from infra.stacks.infrastructure import InfrastructureStack
from infra.stacks.reconciler import Reconciler
from infra.stacks.secrets import placeholder_secret
from infra.stages import StageSettings


class HealthCheckStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        core: InfrastructureStack,
        code: lambda_.Code,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        health = settings.health_check
        # Operators put the bot token in (docs/operations.md).
        self.slack_token = placeholder_secret(
            self,
            "SlackToken",
            settings,
            description=f"{settings.names.prefix}: Slack bot token (xoxb-...) for alerts",
            output="SlackTokenSecretArn",
            output_description="Put the Slack bot token here to get health-check alerts",
            issued_by="A Slack bot token is issued by Slack, not AWS",
        )
        self.handler = AgentqFunction(
            self,
            "HealthCheck",
            settings=settings,
            code=code,
            handler="lambdas.health_check.handler",
            description="Alerts Slack about stuck, overtime and starving tasks and the DLQ",
            environment={
                **core.runtime_environment(
                    "queue_url", "dlq_url", "table_name", "bus_name", "bucket"
                ),
                env_name("slack_token_secret_arn"): self.slack_token.secret_arn,
                env_name("alert_channel"): health.alert_channel,
                env_name("pending_alert_after_s"): str(health.pending_alert_after_s),
                env_name("overtime_grace_s"): str(health.overtime_grace_s),
            },
            statements=[
                # Status-index queries find the tasks; UpdateItem records "alerted once".
                table_statement(
                    core.events_table,
                    EVENTS_TABLE,
                    ["Query", "GetItem", "UpdateItem"],
                    indexes=True,
                ),
                iam.PolicyStatement(
                    actions=["sqs:GetQueueAttributes"],
                    resources=[core.task_queue.queue_arn, core.dead_letter_queue.queue_arn],
                ),
            ],
            timeout=Duration.seconds(120),
            reserved_concurrency=settings.lambda_concurrency.reserved("health-check"),
        )
        # The token's value only (grant_read would add DescribeSecret, which nothing calls).
        self.handler.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue"], resources=[self.slack_token.secret_arn]
            )
        )
        # The DLQ's oldest-message age exists only as a CloudWatch metric, and metric
        # reads support no resource-level permissions: a policy of its own, so this
        # acknowledgment covers nothing else.
        metric_reads = iam.Policy(
            self,
            "MetricReads",
            statements=[
                iam.PolicyStatement(actions=["cloudwatch:GetMetricStatistics"], resources=["*"])
            ],
        )
        metric_reads.attach_to_role(self.handler.role)
        acknowledge(
            metric_reads,
            "IAM5",
            "cloudwatch:GetMetricStatistics (the DLQ's oldest-message age) supports no "
            "resource-level permissions; AWS allows only Resource '*'",
            applies_to="Resource::*",
        )
        self.schedule = self.handler.schedule(
            self,
            "Schedule",
            what="health check",
            rate_minutes=health.rate_minutes,
            enabled=health.enabled,
        )
        self.reconciler = Reconciler(self, "Reconcile", settings=settings, core=core, code=code)
        self.functions = {
            "health-check": self.handler.function,
            "reconciler": self.reconciler.handler.function,
        }
