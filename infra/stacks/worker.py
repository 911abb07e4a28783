"""The worker fleet: a Fargate service running `agentq worker`, scaled on backlog per task.

Scaling (AWS's recommended pattern for queue workers): target tracking on the metric
math expression `visible messages / running tasks`, with the stage's acceptable
backlog per task as the target. That ratio is undefined at zero tasks, so a second,
step policy watches `running == 0 AND visible > 0` and adds the first task; it can
never fire while target tracking is in charge, so the two do not fight. There is
deliberately no CPU policy: workers mostly wait on the model, and a CPU policy would
scale in against the queue policy. Scale-in never kills work in flight because the
worker protects its own ECS task (agent endpoint, no IAM) while it runs tasks.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from agentq.config import env_name
from agentq.resources import (
    ARTIFACTS_PREFIX,
    DEFINITIONS_TABLE,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
)
from infra.assets import REPO_ROOT
from infra.nag import acknowledge
from infra.policies import (
    SecretValueOnly,
    grant_objects,
    start_up_checks_statement,
    table_statement,
)
from infra.stacks.ecs_ordering import AfterCapacityProviders
from infra.stacks.infrastructure import InfrastructureStack
from infra.stages import StageSettings, WorkerSettings

CONTAINER_NAME = "worker"
LIVENESS_FILE = "/tmp/agentq-worker.alive"  # the Dockerfile's LIVENESS_FILE too


class WorkerStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        core: InfrastructureStack,
        claude_secret: secretsmanager.ISecret,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        worker = settings.worker
        prefix = settings.names.prefix

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=worker.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC),
                ec2.SubnetConfiguration(
                    name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
                ),
            ],
        )
        # Table and bucket traffic stays on AWS's network and off the NAT bill (free).
        self.vpc.add_gateway_endpoint("DynamoDb", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB)
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        flow_logs = logs.LogGroup(
            self,
            "FlowLogs",
            retention=settings.log_retention,
            removal_policy=settings.removal_policy,
        )
        self.vpc.add_flow_log(
            "FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs)
        )
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            cluster_name=prefix,
            vpc=self.vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
            enable_fargate_capacity_providers=True,
        )

        # The Anthropic API key comes from the secrets stack, which the operator fills
        # before this stack deploys (infra/stacks/secrets.py says why); ECS injects it.
        self.claude_secret = claude_secret

        self.task_role = iam.Role(
            self,
            "TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"{prefix} worker: its queue, its table, its bus, its prefixes",
        )
        for statement in self.task_statements(core):
            self.task_role.add_to_principal_policy(statement)
        protection = self.task_protection_statement(prefix)
        self.task_role.add_to_principal_policy(protection)
        acknowledge(
            self.task_role,
            "IAM5",
            "ECS task scale-in protection is set per task, and task ARNs are made at run "
            "time: the wildcard covers only tasks of this stage's cluster",
            applies_to=f"Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:task/{prefix}/*",
        )
        grant_objects(
            self.task_role, core.bucket, [ARTIFACTS_PREFIX, EVENT_OVERFLOW_PREFIX], ["PutObject"]
        )
        # A resumable agent task's retry reads the session checkpoint an earlier attempt
        # wrote under the task's own prefix (worker/settle/checkpoints.py).
        grant_objects(
            self.task_role, core.bucket, [ARTIFACTS_PREFIX], ["GetObject"], "CheckpointReads"
        )

        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            cpu=worker.cpu,
            memory_limit_mib=worker.memory_mib,
            task_role=self.task_role,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=settings.log_retention, removal_policy=settings.removal_policy
        )
        self.container = self.task_definition.add_container(
            CONTAINER_NAME,
            # Built for the task definition's platform, whatever machine runs the deploy.
            image=ecs.ContainerImage.from_asset(
                str(REPO_ROOT), file="Dockerfile", platform=ecr_assets.Platform.LINUX_AMD64
            ),
            logging=ecs.LogDriver.aws_logs(stream_prefix="worker", log_group=self.log_group),
            environment=self.runtime_environment(settings, core),
            # Its value only: ECS never describes the secret.
            secrets={"ANTHROPIC_API_KEY": SecretValueOnly(self.claude_secret)},
            # ECS sends SIGTERM, waits this long, then SIGKILLs; the drain fits inside.
            stop_timeout=Duration.seconds(worker.stop_timeout_s),
            # An init process reaps the Claude CLI's orphaned grandchildren.
            linux_parameters=ecs.LinuxParameters(self, "Linux", init_process_enabled=True),
            # Fails only when the heartbeat loop stops touching its file (worker/liveness.py):
            # a worker busy with long tasks keeps beating, a hung one does not.
            health_check=ecs.HealthCheck(
                command=["CMD", "python", "-m", "worker.liveness"],
                interval=Duration.seconds(30),
                timeout=Duration.seconds(10),
                retries=3,
                start_period=Duration.seconds(120),
            ),
        )
        acknowledge(
            self.task_definition.obtain_execution_role(),
            "IAM5",
            "ECS's execution role needs ecr:GetAuthorizationToken to pull the image; that "
            "action supports no resource-level permissions (AWS allows only '*')",
            applies_to="Resource::*",
        )
        acknowledge(
            self.task_definition,
            "ECS2",
            "The environment holds only resource names and tunables; the one secret "
            "(Anthropic API key) is injected from Secrets Manager",
        )

        self.service = ecs.FargateService(
            self,
            "Service",
            service_name=f"{prefix}-worker",
            cluster=self.cluster,
            task_definition=self.task_definition,
            # No desired count: autoscaling owns it, and a count in the template would
            # reset the scaled fleet on every stack update. On create ECS starts one task,
            # which the filled secret lets start (docs/deploy.md).
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            capacity_provider_strategies=self.capacity(worker),
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
        )
        # ECS may reject a service whose capacity provider strategy names a provider the
        # cluster is still being associated with (they are created in parallel otherwise).
        cdk.Aspects.of(self.cluster).add(
            AfterCapacityProviders(self.service), priority=cdk.AspectPriority.DEFAULT
        )
        self._autoscaling(settings, core)

    def task_statements(self, core: InfrastructureStack) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:DeleteMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes",
                    # A requeue (retry with backoff past the visibility limit, a give-back)
                    # sends a fresh copy; without it every requeue spends a receive.
                    "sqs:SendMessage",
                ],
                # Every tier's queue: the worker receives from all, and forwards a message
                # to its tier's queue (SendMessage) when it arrived on another.
                resources=core.tier_queue_arns,
            ),
            # The conditional lock, lease renewals and finalization are all on STATE items.
            table_statement(
                core.events_table,
                EVENTS_TABLE,
                ["GetItem", "PutItem", "UpdateItem", "Query"],
                indexes=True,
            ),
            table_statement(core.definitions_table, DEFINITIONS_TABLE, ["GetItem", "Scan"]),
            iam.PolicyStatement(actions=["events:PutEvents"], resources=[core.bus.event_bus_arn]),
            # The start-up checks (worker/preflight.py).
            start_up_checks_statement(core.bus, core.bucket),
        ]

    @staticmethod
    def capacity(worker: WorkerSettings) -> list[ecs.CapacityProviderStrategy]:
        strategies = [
            ecs.CapacityProviderStrategy(
                capacity_provider="FARGATE", base=worker.on_demand_base, weight=1
            )
        ]
        if worker.spot_weight:
            strategies.append(
                ecs.CapacityProviderStrategy(
                    capacity_provider="FARGATE_SPOT", weight=worker.spot_weight
                )
            )
        return strategies

    def task_protection_statement(self, cluster_name: str) -> iam.PolicyStatement:
        """The ECS agent endpoint calls ECS with the task role's credentials: without these
        actions scale-in protection is silently refused and ECS stops busy workers."""
        return iam.PolicyStatement(
            actions=["ecs:UpdateTaskProtection", "ecs:GetTaskProtection"],
            resources=[
                cdk.Stack.of(self).format_arn(
                    service="ecs", resource="task", resource_name=f"{cluster_name}/*"
                )
            ],
        )

    @staticmethod
    def runtime_environment(settings: StageSettings, core: InfrastructureStack) -> dict[str, str]:
        worker = settings.worker
        return {
            **core.runtime_environment(
                "queue_url", "queue_urls", "table_name", "definitions_table", "bus_name", "bucket"
            ),
            env_name("app_name"): settings.app_name,
            env_name("stage"): settings.name,
            env_name("region"): cdk.Aws.REGION,
            env_name("max_concurrent"): str(worker.slots),
            env_name("drain_timeout_ms"): str(worker.drain_timeout_s * 1000),
            env_name("task_timeout_ms"): str(worker.task_timeout_s * 1000),
            env_name("warm_agent"): worker.warm_agent,
            env_name("log_level"): "INFO",
            env_name("liveness_file"): LIVENESS_FILE,
            **({env_name("metric_tenants_list"): ",".join(worker.metric_tenants)}
               if worker.metric_tenants else {}),
            **({env_name("tenant_concurrency_limit"): str(worker.tenant_concurrency_limit)}
               if worker.tenant_concurrency_limit else {}),
        }  # fmt: skip

    def _autoscaling(self, settings: StageSettings, core: InfrastructureStack) -> None:
        worker = settings.worker
        scaling = self.service.auto_scale_task_count(
            min_capacity=worker.min_tasks, max_capacity=worker.max_tasks
        )
        tiers = list(core.tier_queues.items())
        visible_by_tier = {
            f"visible{rank}": queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(1), statistic="Maximum"
            )
            for rank, (_, queue) in enumerate(tiers)
        }
        any_visible = " + ".join(f"FILL({name}, 0)" for name in visible_by_tier)
        running = cloudwatch.Metric(
            namespace="ECS/ContainerInsights",
            metric_name="RunningTaskCount",
            dimensions_map={
                "ClusterName": self.cluster.cluster_name,
                "ServiceName": self.service.service_name,
            },
            period=Duration.minutes(1),
            statistic="Average",
        )
        # Zero tasks: the ratio below divides by zero and target tracking sees no data.
        # This policy covers exactly that case, so it never competes with the ratio.
        idle_with_backlog = cloudwatch.MathExpression(
            expression=f"IF(FILL(running, 0) == 0 AND ({any_visible}) > 0, 1, 0)",
            using_metrics={**visible_by_tier, "running": running},
            period=Duration.minutes(1),
            label="backlog with no running worker",
        )
        scaling.scale_on_metric(
            "StartFromZero",
            metric=idle_with_backlog,
            scaling_steps=[
                appscaling.ScalingInterval(upper=0.5, change=0),
                appscaling.ScalingInterval(lower=0.5, change=1),
            ],
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            evaluation_periods=1,
            cooldown=Duration.seconds(worker.scale_out_cooldown_s),
        )
        # Target tracking on metric math has no L2 in CDK (it accepts only plain metrics).
        target = scaling.node.find_child("Target")
        assert isinstance(target, appscaling.ScalableTarget)
        self.backlog_policy = appscaling.CfnScalingPolicy(
            self,
            "BacklogPerTask",
            policy_name=f"{settings.names.prefix}-backlog-per-task",
            policy_type="TargetTrackingScaling",
            scaling_target_id=target.scalable_target_id,
            target_tracking_scaling_policy_configuration=appscaling.CfnScalingPolicy.TargetTrackingScalingPolicyConfigurationProperty(
                target_value=float(worker.backlog_per_task),
                scale_out_cooldown=worker.scale_out_cooldown_s,
                scale_in_cooldown=worker.scale_in_cooldown_s,
                customized_metric_specification=appscaling.CfnScalingPolicy.CustomizedMetricSpecificationProperty(
                    metrics=[
                        *(
                            _stat_query(
                                f"visible{rank}",
                                "AWS/SQS",
                                "ApproximateNumberOfMessagesVisible",
                                {"QueueName": queue.queue_name},
                            )
                            for rank, (_, queue) in enumerate(tiers)
                        ),
                        _stat_query(
                            "running",
                            "ECS/ContainerInsights",
                            "RunningTaskCount",
                            {
                                "ClusterName": self.cluster.cluster_name,
                                "ServiceName": self.service.service_name,
                            },
                        ),
                        appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
                            id="backlogPerTask",
                            expression=f"({weighted_backlog(len(tiers))}) / running",
                            label="visible messages per running worker task, weighted by tier",
                            return_data=True,
                        ),
                    ]
                ),
            ),
        )


def weighted_backlog(tiers: int) -> str:
    """Every tier's visible messages, the higher tiers counting more: a high-priority
    backlog scales out sooner (x2 above the default tier, x0.5 below it, by rank)."""
    middle = (tiers - 1) / 2
    terms = [f"{2.0 ** (middle - rank):g} * visible{rank}" for rank in range(tiers)]
    return " + ".join(terms)


def _stat_query(
    query_id: str, namespace: str, metric_name: str, dimensions: dict[str, str]
) -> appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty:
    return appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
        id=query_id,
        return_data=False,
        metric_stat=appscaling.CfnScalingPolicy.TargetTrackingMetricStatProperty(
            stat="Average",
            metric=appscaling.CfnScalingPolicy.TargetTrackingMetricProperty(
                namespace=namespace,
                metric_name=metric_name,
                dimensions=[
                    appscaling.CfnScalingPolicy.TargetTrackingMetricDimensionProperty(
                        name=name, value=value
                    )
                    for name, value in dimensions.items()
                ],
            ),
        ),
    )
