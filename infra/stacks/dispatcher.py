"""The job dispatcher: on a terminal task event of a job, enqueue the ready successors."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from agentq.resources import (
    ARTIFACTS_PREFIX,
    DEFINITIONS_TABLE,
    DISPATCHER_RULE,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
)
from infra.function import AgentqFunction
from infra.policies import grant_objects, table_statement
from infra.stacks.infrastructure import InfrastructureStack, event_pattern
from infra.stages import StageSettings


class DispatcherStack(cdk.Stack):
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
        self.handler = AgentqFunction(
            self,
            "Dispatcher",
            settings=settings,
            code=code,
            handler="lambdas.dispatcher.handler",
            event_driven=True,
            description="Drives job DAGs: enqueues ready successors, closes finished jobs",
            environment=core.runtime_environment(
                "queue_url", "table_name", "definitions_table", "bus_name", "bucket"
            ),
            statements=[
                # Conditional BLOCKED -> PENDING, ADD counters on the job item, byJob queries.
                table_statement(
                    core.events_table,
                    EVENTS_TABLE,
                    [
                        "GetItem",
                        "BatchGetItem",
                        "PutItem",
                        "UpdateItem",
                        "Query",
                        "ConditionCheckItem",
                    ],
                    indexes=True,
                ),
                table_statement(core.definitions_table, DEFINITIONS_TABLE, ["GetItem"]),
                iam.PolicyStatement(
                    actions=["sqs:SendMessage"], resources=[core.task_queue.queue_arn]
                ),
                iam.PolicyStatement(
                    actions=["events:PutEvents"], resources=[core.bus.event_bus_arn]
                ),
            ],
            timeout=Duration.seconds(60),
        )
        # Upstream results are passed on to successors; oversized events overflow to S3.
        grant_objects(self.handler.role, core.bucket, [ARTIFACTS_PREFIX], ["GetObject"])
        grant_objects(
            self.handler.role, core.bucket, [EVENT_OVERFLOW_PREFIX], ["PutObject"], "Overflow"
        )
        events.Rule(
            self,
            "Rule",
            rule_name=f"{settings.names.prefix}-{DISPATCHER_RULE.name}",
            description=DISPATCHER_RULE.description,
            event_bus=core.bus,
            event_pattern=event_pattern(DISPATCHER_RULE, settings.app_name),
            targets=[
                targets.LambdaFunction(
                    self.handler.function,
                    retry_attempts=185,
                    max_event_age=Duration.hours(24),
                    dead_letter_queue=self.handler.failed_events,
                )
            ],
        )
        self.functions = {"dispatcher": self.handler.function}
