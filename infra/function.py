"""AgentqFunction: one agentq Lambda with its own role, log group and shared code asset.

Each function gets a role of its own holding only inline statements (no AWS managed
policy: `AWSLambdaBasicExecutionRole` would grant logs on every group) and a log group
with the stage's retention, created before the function so Lambda never makes an
unbounded one. An event-driven function also owns the queue its failed events land in,
and `subscribe` wires a bus rule to it with the retry policy that queue is meant for;
`schedule` runs a function on a fixed rate instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.config import env_name
from agentq.resources import RuleSpec
from infra.assets import LAMBDA_ARCHITECTURE, LAMBDA_RUNTIME
from infra.nag import acknowledge
from infra.stacks.infrastructure import event_pattern
from infra.stages import StageSettings

# EventBridge's maxima: a failing event is retried for a day before it is dead-lettered.
EVENT_RETRY_ATTEMPTS: Final = 185
EVENT_MAX_AGE: Final = Duration.hours(24)


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
        reserved_concurrency: int | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._settings = settings
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
            reserved_concurrent_executions=reserved_concurrency,
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

    def subscribe(
        self, scope: Construct, construct_id: str, *, rule: RuleSpec, bus: events.IEventBus
    ) -> events.Rule:
        """The bus rule `rule` (agentq.resources), named for the stage, invoking this function.

        The rule is made in `scope` under `construct_id` rather than inside this construct:
        a named rule must keep its logical ID, since CloudFormation cannot replace it under
        the name it already holds.
        """
        if self.failed_events is None:
            raise ValueError(f"{self.node.path}: only an event_driven function can subscribe")
        return events.Rule(
            scope,
            construct_id,
            rule_name=f"{self._settings.names.prefix}-{rule.name}",
            description=rule.description,
            event_bus=bus,
            event_pattern=event_pattern(rule, self._settings.app_name),
            targets=[
                targets.LambdaFunction(
                    self.function,
                    retry_attempts=EVENT_RETRY_ATTEMPTS,
                    max_event_age=EVENT_MAX_AGE,
                    dead_letter_queue=self.failed_events,
                )
            ],
        )

    def schedule(
        self,
        scope: Construct,
        construct_id: str,
        *,
        what: str,
        rate_minutes: int,
        enabled: bool,
    ) -> events.Rule:
        """A rule invoking this function every `rate_minutes`, made in `scope` under
        `construct_id` (as with `subscribe`, the caller's tree keeps its logical IDs).

        No retries: a missed run is repaired by the next one; retrying it would only
        overlap with it.
        """
        return events.Rule(
            scope,
            construct_id,
            description=f"{what} every {rate_minutes} min",
            schedule=events.Schedule.rate(Duration.minutes(rate_minutes)),
            enabled=enabled,
            targets=[targets.LambdaFunction(self.function, retry_attempts=0)],
        )
