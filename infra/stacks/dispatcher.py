"""The job dispatcher: on a terminal task event of a job, enqueue the ready successors."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from agentq.resources import ARTIFACTS_PREFIX, DISPATCHER_RULE, EVENT_OVERFLOW_PREFIX
from infra.function import AgentqFunction
from infra.policies import grant_objects
from infra.stacks.infrastructure import InfrastructureStack
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
                "queue_url", "queue_urls", "table_name", "definitions_table", "bus_name", "bucket"
            ),
            # It is an AgentqClient: reconciles the job, enqueues successors, publishes.
            statements=core.client_statements(),
            timeout=Duration.seconds(60),
            reserved_concurrency=settings.lambda_concurrency.reserved("dispatcher"),
        )
        # Upstream results are passed on to successors; oversized events overflow to S3.
        grant_objects(self.handler.role, core.bucket, [ARTIFACTS_PREFIX], ["GetObject"])
        grant_objects(
            self.handler.role, core.bucket, [EVENT_OVERFLOW_PREFIX], ["PutObject"], "Overflow"
        )
        self.handler.subscribe(self, "Rule", rule=DISPATCHER_RULE, bus=core.bus)
        self.functions = {"dispatcher": self.handler.function}
