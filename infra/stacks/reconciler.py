"""The reconciler: a scheduled Lambda that repairs what no event will ever fix.

A construct, not a stack: it lives beside the health check (both watch the stage on a
schedule) and shares its imports of the core resources. Its role holds what the sweep
does and nothing more: status-index queries and conditional updates on the events
table (claims, the dispatcher's moves, counters and closes), sending task messages,
publishing events, reading upstream results and writing event overflow.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from agentq.config import env_name
from agentq.resources import ARTIFACTS_PREFIX, EVENT_OVERFLOW_PREFIX, EVENTS_TABLE
from infra.function import AgentqFunction
from infra.policies import grant_objects, table_statement
from infra.stacks.infrastructure import InfrastructureStack
from infra.stages import StageSettings


class Reconciler(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        core: InfrastructureStack,
        code: lambda_.Code,
    ) -> None:
        super().__init__(scope, construct_id)
        reconcile = settings.reconciler
        self.handler = AgentqFunction(
            self,
            "Reconciler",
            settings=settings,
            code=code,
            handler="lambdas.reconciler.handler",
            description="Re-sends lost task messages and moves stalled jobs on",
            environment={
                # No definitions table: it re-sends stored envelopes, never checks a new one.
                **core.runtime_environment("queue_url", "table_name", "bus_name", "bucket"),
                env_name("reconcile_lost_after_s"): str(reconcile.lost_after_s),
                env_name("reconcile_stall_after_s"): str(reconcile.stall_after_s),
            },
            statements=[
                # No PutItem/DeleteItem and no Scan: it creates and deletes nothing.
                table_statement(
                    core.events_table,
                    EVENTS_TABLE,
                    ["GetItem", "BatchGetItem", "UpdateItem", "Query"],
                    indexes=True,
                ),
                iam.PolicyStatement(
                    actions=["sqs:SendMessage"], resources=[core.task_queue.queue_arn]
                ),
                iam.PolicyStatement(
                    actions=["events:PutEvents"], resources=[core.bus.event_bus_arn]
                ),
            ],
            timeout=Duration.seconds(300),
            reserved_concurrency=settings.lambda_concurrency.reserved("reconciler"),
        )
        # A job moved on gets its upstream results; an oversized event overflows to S3.
        grant_objects(self.handler.role, core.bucket, [ARTIFACTS_PREFIX], ["GetObject"])
        grant_objects(
            self.handler.role, core.bucket, [EVENT_OVERFLOW_PREFIX], ["PutObject"], "Overflow"
        )
        self.schedule = self.handler.schedule(
            self,
            "Schedule",
            what="reconciler",
            rate_minutes=reconcile.rate_minutes,
            enabled=reconcile.enabled,
        )
