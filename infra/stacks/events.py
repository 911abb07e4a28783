"""Event persistence: the save-event Lambda behind the bus rule, and the DLQ processor."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from constructs import Construct

from agentq.config import env_name
from agentq.resources import (
    DLQ_ARCHIVE_PREFIX,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
    SAVE_EVENT_RULE,
)
from infra.function import AgentqFunction
from infra.policies import grant_objects, table_statement
from infra.stacks.infrastructure import DLQ_PROCESSOR_TIMEOUT_S, InfrastructureStack
from infra.stages import StageSettings


class EventsStack(cdk.Stack):
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
        self.save_event = AgentqFunction(
            self,
            "SaveEvent",
            settings=settings,
            code=code,
            handler="lambdas.save_event.handler",
            event_driven=True,
            reserved_concurrency=settings.lambda_concurrency.reserved("save-event"),
            description="Appends agentq events to the events table (idempotent)",
            environment={
                **core.runtime_environment("table_name", "bus_name", "bucket"),
                env_name("event_ttl_days"): str(settings.event_ttl_days),
            },
            statements=[
                # Conditional put of the event item, update of the STATE item's summary.
                table_statement(core.events_table, EVENTS_TABLE, ["PutItem", "UpdateItem"]),
            ],
        )
        self.save_event.subscribe(self, "SaveEventRule", rule=SAVE_EVENT_RULE, bus=core.bus)

        self.dlq_processor = AgentqFunction(
            self,
            "DlqProcessor",
            settings=settings,
            code=code,
            handler="lambdas.dlq_processor.handler",
            description="Archives dead letters; returns or closes out their tasks",
            environment=core.runtime_environment(
                "queue_url", "dlq_url", "table_name", "bus_name", "bucket"
            ),
            statements=[
                # PutItem: a dead letter whose producer never wrote the STATE item gets
                # one (conditional create), so its task still ends FAILED; the enforced
                # local run found it missing (docs/least-privilege.md).
                table_statement(
                    core.events_table, EVENTS_TABLE, ["GetItem", "PutItem", "UpdateItem"]
                ),
                iam.PolicyStatement(
                    actions=["events:PutEvents"], resources=[core.bus.event_bus_arn]
                ),
                # A dead letter whose task has attempts left goes back to the task queue.
                iam.PolicyStatement(
                    actions=["sqs:SendMessage"], resources=[core.task_queue.queue_arn]
                ),
            ],
            timeout=Duration.seconds(DLQ_PROCESSOR_TIMEOUT_S),
        )
        # The archive keeps each dead letter for redrive; oversized events overflow to S3.
        grant_objects(
            self.dlq_processor.role,
            core.bucket,
            [DLQ_ARCHIVE_PREFIX, EVENT_OVERFLOW_PREFIX],
            ["PutObject"],
        )
        # The event source grants receive/delete/change-visibility on the DLQ's ARN only.
        self.dlq_processor.function.add_event_source(
            sources.SqsEventSource(
                core.dead_letter_queue,
                batch_size=settings.dlq_batch_size,
                report_batch_item_failures=True,
                # The event source's own cap (its minimum), not reserved concurrency:
                # a throttled SQS invocation would return the batch and cost receives.
                max_concurrency=2,
            )
        )
        self.functions = {
            "save-event": self.save_event.function,
            "dlq-processor": self.dlq_processor.function,
        }
