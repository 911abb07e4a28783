"""The stateful core of a stage: task queues (one per priority tier) + DLQ, events and definitions tables, the bus
with its queue-bound rule, and the artifacts bucket (with its access-log bucket).

Other stacks receive these constructs as Python objects; CDK turns each reference into
a CloudFormation export/import pair, so no stack hard-codes another's names.
"""

from __future__ import annotations

from typing import Any, Final

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.config import env_name
from agentq.resources import (
    ARTIFACTS_PREFIX,
    DEFAULT_TIER,
    DEFINITIONS_TABLE,
    DLQ_ARCHIVE_PREFIX,
    EVENT_OVERFLOW_PREFIX,
    EVENTS_TABLE,
    JOB_PK_PREFIX,
    PRINCIPAL_PK_PREFIX,
    ROSTER_PK,
    RULES,
    TASK_PK_PREFIX,
    TASK_QUEUE,
    TENANT_PK_PREFIX,
    RuleSpec,
    TableSpec,
)
from infra.nag import acknowledge
from infra.policies import leading_keys, table_statement
from infra.stages import StageSettings

DLQ_PROCESSOR_TIMEOUT_S: Final = 60
DLQ_VISIBILITY_TIMEOUT_S: Final = 6 * DLQ_PROCESSOR_TIMEOUT_S


def event_pattern(rule: RuleSpec, app_name: str) -> events.EventPattern:
    """The shared rule pattern as a CDK EventPattern (the local stack uses the same dict)."""
    pattern = rule.pattern(app_name)
    detail_type = pattern.get("detail-type")
    if rule.excluded_detail_types:
        detail_type = events.Match.anything_but(*rule.excluded_detail_types)
    return events.EventPattern(
        source=pattern["source"], detail_type=detail_type, detail=pattern.get("detail")
    )


def _attribute(name: str) -> dynamodb.Attribute:
    # Every agentq key attribute is a string (see agentq.local.aws.table_definition).
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


class InfrastructureStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: StageSettings, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        names = settings.names
        self.settings = settings

        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            queue_name=names.dead_letter_queue,
            retention_period=Duration.days(TASK_QUEUE.dlq_retention_days),
            # AWS asks for 6x the consuming Lambda's timeout (the DLQ processor's is 60 s).
            visibility_timeout=Duration.seconds(DLQ_VISIBILITY_TIMEOUT_S),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=settings.removal_policy,
        )
        # One queue per priority tier, all alike; the default tier's is the task queue
        # itself (same construct id and name as before tiers existed: no replacement).
        self.tier_queues = {
            tier: self._task_queue(
                "TaskQueue" if tier == DEFAULT_TIER else f"TaskQueue-{tier}", name
            )
            for tier, name in names.tier_queues().items()
        }
        self.task_queue = self.tier_queues[DEFAULT_TIER]

        self.events_table = self._table("EventsTable", names.events_table, EVENTS_TABLE)
        self.definitions_table = self._table(
            "DefinitionsTable", names.definitions_table, DEFINITIONS_TABLE
        )

        self.bus = events.EventBus(self, "Bus", event_bus_name=names.event_bus)
        # 'Task Requested' events EventBridge could not put on the task queue (a queue
        # policy or KMS change, throttling past a day of retries) wait here, not vanish.
        self.rule_dead_letters = sqs.Queue(
            self,
            "TaskRequestedDeadLetters",
            retention_period=Duration.days(14),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=settings.removal_policy,
        )
        acknowledge(
            self.rule_dead_letters,
            "SQS3",
            "This queue is itself a dead-letter queue: it keeps 'Task Requested' events "
            "EventBridge could not deliver to the task queue, for inspection and redrive",
        )
        self.task_requested_rules: list[events.Rule] = []
        for rule in RULES:
            if rule.target == "task-queue":
                created = events.Rule(
                    self,
                    f"Rule-{rule.name}",
                    rule_name=f"{names.prefix}-{rule.name}",
                    description=rule.description,
                    event_bus=self.bus,
                    event_pattern=event_pattern(rule, settings.app_name),
                    targets=[
                        targets.SqsQueue(
                            self.task_queue,
                            dead_letter_queue=self.rule_dead_letters,
                            retry_attempts=185,
                            max_event_age=Duration.hours(24),
                            message_group_id=rule.message_group_path,
                        )
                    ],
                )
                self.task_requested_rules.append(created)

        self.access_logs_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            # Log delivery is granted by bucket policy (context flag set in infra.app), not ACLs.
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-access-logs",
                    expiration=Duration.days(settings.access_log_expiry_days),
                )
            ],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        # Buckets are retained in every stage: deleting one needs an auto-delete custom
        # resource (an extra Lambda with broad S3 rights) for little benefit.
        self.bucket = s3.Bucket(
            self,
            "Artifacts",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=False,
            server_access_logs_bucket=self.access_logs_bucket,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-task-logs",
                    prefix=ARTIFACTS_PREFIX,
                    expiration=Duration.days(settings.artifact_expiry_days),
                ),
                s3.LifecycleRule(
                    id="expire-event-overflow",
                    prefix=EVENT_OVERFLOW_PREFIX,
                    expiration=Duration.days(settings.overflow_expiry_days),
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        self.producer_policy = self._producer_policy()
        self.operator_policy = self._operator_policy()

    def producer_statements(self) -> list[iam.PolicyStatement]:
        """What a producer (agentq.client, the CLI's submit/status/wait/job) may do."""
        return [
            *self.client_statements(),
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.bucket.arn_for_objects(f"{ARTIFACTS_PREFIX}*")],
            ),
            iam.PolicyStatement(
                actions=["s3:PutObject"],
                resources=[self.bucket.arn_for_objects(f"{EVENT_OVERFLOW_PREFIX}*")],
            ),
            # `agentq logs`/`trace` and AgentqClient.artifacts() list a task's attempt
            # folder; listing is allowed under the task prefix only.
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{ARTIFACTS_PREFIX}*"]}},
            ),
        ]

    def _producer_policy(self) -> iam.ManagedPolicy:
        """Attach to the services, CI roles and people that submit tasks. The local
        stack's producer signs with exactly these statements (agentq.local.iam)."""
        policy = iam.ManagedPolicy(
            self,
            "ProducerPolicy",
            description=f"{self.settings.names.prefix} producers: submit and read tasks and jobs",
            statements=self.producer_statements(),
        )
        self._acknowledge_producer_objects(policy, "Producers")
        cdk.CfnOutput(
            self,
            "ProducerPolicyArn",
            value=policy.managed_policy_arn,
            description="Attach to every principal that submits or reads agentq tasks",
        )
        return policy

    def _operator_policy(self) -> iam.ManagedPolicy:
        """What an operator's commands need beyond a producer's: the dead-letter archive
        (`agentq dlq`, the console's redrive and discard), queue depths (`agentq stats`,
        the console's queues), tenant limits and principal mappings set and removed (`agentq
        tenants limit`, `tenants map`, `tenants unmap`).
        Cancel, retry and resubmit are a producer's rights. The local stack's operator
        signs with exactly these statements (agentq.local.iam)."""
        archive = self.bucket.arn_for_objects(f"{DLQ_ARCHIVE_PREFIX}*")
        policy = iam.ManagedPolicy(
            self,
            "OperatorPolicy",
            description=f"{self.settings.names.prefix} operators: dead letters, tenant "
            "limits and mappings, stats and the console's actions, besides a producer's rights",
            statements=[
                *self.producer_statements(),
                # `agentq dlq list|redrive` and the console list the archive only.
                iam.PolicyStatement(
                    sid="ListDeadLetterArchive",
                    actions=["s3:ListBucket"],
                    resources=[self.bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{DLQ_ARCHIVE_PREFIX}*"]}},
                ),
                iam.PolicyStatement(
                    sid="ReadDeadLetterArchive", actions=["s3:GetObject"], resources=[archive]
                ),
                # A redrive rewrites the archived letter with its redrive time.
                iam.PolicyStatement(
                    sid="MarkDeadLettersRedriven", actions=["s3:PutObject"], resources=[archive]
                ),
                # The console's discard deletes the archived letter.
                iam.PolicyStatement(
                    sid="DiscardDeadLetters", actions=["s3:DeleteObject"], resources=[archive]
                ),
                # `agentq dlq list --peek`: a receive with visibility 0 (the DLQ has no
                # redrive policy, so a peek dead-letters nothing).
                iam.PolicyStatement(
                    sid="PeekDeadLetterQueue",
                    actions=["sqs:ReceiveMessage"],
                    resources=[self.dead_letter_queue.queue_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadQueueDepths",
                    actions=["sqs:GetQueueAttributes"],
                    resources=[*self.tier_queue_arns, self.dead_letter_queue.queue_arn],
                ),
                # `agentq tenants` reads limits, seats and mappings, `agentq stats` and
                # the console the workers' roster: items a producer may not even read.
                iam.PolicyStatement(
                    sid="ReadTenantsAndWorkers",
                    actions=["dynamodb:GetItem", "dynamodb:Query"],
                    resources=[self.events_table.table_arn],
                    conditions=leading_keys(TENANT_PK_PREFIX, PRINCIPAL_PK_PREFIX, ROSTER_PK),
                ),
                # `agentq tenants limit T N` puts the override's item, `agentq tenants
                # map` the principal's mapping (whole items): producers may not.
                iam.PolicyStatement(
                    sid="SetTenantSettings",
                    actions=["dynamodb:PutItem"],
                    resources=[self.events_table.table_arn],
                    conditions=leading_keys(TENANT_PK_PREFIX, PRINCIPAL_PK_PREFIX),
                ),
                # `agentq tenants limit T default` deletes the override's item, `agentq
                # tenants unmap` the principal's mapping: only such items, never a task's.
                iam.PolicyStatement(
                    sid="RemoveTenantSettings",
                    actions=["dynamodb:DeleteItem"],
                    resources=[self.events_table.table_arn],
                    conditions=leading_keys(TENANT_PK_PREFIX, PRINCIPAL_PK_PREFIX),
                ),
                # The oldest message's age per queue: `agentq stats` (GetMetricData) and
                # the console's queues (GetMetricStatistics), on AWS.
                iam.PolicyStatement(
                    sid="ReadQueueAgeMetrics",
                    actions=["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics"],
                    resources=["*"],
                ),
            ],
        )
        self._acknowledge_producer_objects(policy, "Operators")
        logical_id = self.get_logical_id(self.bucket.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            policy,
            "IAM5",
            "Operators read, rewrite and delete only archived dead letters (objects under "
            f"{DLQ_ARCHIVE_PREFIX}); their keys are per task, so the key part is a wildcard",
            applies_to=f"Resource::<{logical_id}.Arn>/{DLQ_ARCHIVE_PREFIX}*",
        )
        acknowledge(
            policy,
            "IAM5",
            "cloudwatch:GetMetricData and GetMetricStatistics (the queues' oldest-message "
            "age) support no resource-level permissions; AWS allows only Resource '*'",
            applies_to="Resource::*",
        )
        cdk.CfnOutput(
            self,
            "OperatorPolicyArn",
            value=policy.managed_policy_arn,
            description="Attach to the people and CI roles that run agentq's operator commands",
        )
        return policy

    def _acknowledge_producer_objects(self, policy: iam.ManagedPolicy, who: str) -> None:
        logical_id = self.get_logical_id(self.bucket.node.default_child)  # type: ignore[arg-type]
        for prefix, action in (
            (ARTIFACTS_PREFIX, "GetObject"),
            (EVENT_OVERFLOW_PREFIX, "PutObject"),
        ):
            acknowledge(
                policy,
                "IAM5",
                f"{who} get s3:{action} only on objects under {prefix} of the agentq "
                "bucket; object keys are per task, so the key part must be a wildcard",
                applies_to=f"Resource::<{logical_id}.Arn>/{prefix}*",
            )

    def _task_queue(self, construct_id: str, name: str) -> sqs.Queue:
        return sqs.Queue(
            self,
            construct_id,
            queue_name=name,
            visibility_timeout=Duration.seconds(TASK_QUEUE.visibility_timeout_s),
            receive_message_wait_time=Duration.seconds(TASK_QUEUE.receive_wait_s),
            retention_period=Duration.days(TASK_QUEUE.retention_days),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letter_queue, max_receive_count=TASK_QUEUE.max_receive_count
            ),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            removal_policy=self.settings.removal_policy,
        )

    def _table(self, construct_id: str, name: str, spec: TableSpec) -> dynamodb.Table:
        table = dynamodb.Table(
            self,
            construct_id,
            table_name=name,
            partition_key=_attribute(spec.partition_key),
            sort_key=_attribute(spec.sort_key) if spec.sort_key else None,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=spec.ttl_attribute,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=self.settings.removal_policy,
            deletion_protection=self.settings.is_production,
        )
        for index in spec.indexes:
            table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.partition_key),
                sort_key=_attribute(index.sort_key),
                projection_type=dynamodb.ProjectionType.ALL,
            )
        return table

    @property
    def tier_queue_arns(self) -> list[str]:
        return [queue.queue_arn for queue in self.tier_queues.values()]

    def runtime_environment(self, *attributes: str) -> dict[str, str]:
        """Environment variables (names from agentq.config) pointing at these resources."""
        values = {
            "queue_url": self.task_queue.queue_url,
            "queue_urls": ",".join(f"{t}={q.queue_url}" for t, q in self.tier_queues.items()),
            "dlq_url": self.dead_letter_queue.queue_url,
            "table_name": self.events_table.table_name,
            "definitions_table": self.definitions_table.table_name,
            "bus_name": self.bus.event_bus_name,
            "bucket": self.bucket.bucket_name,
        }
        return {env_name(attribute): values[attribute] for attribute in attributes}

    def client_statements(self) -> list[iam.PolicyStatement]:
        """What an agentq.client.AgentqClient does here: TaskStore's conditional creates and
        transitions, job counters and reads by job (its indexes), definition lookups, the
        enqueue and the event. Its bucket access is per prefix (infra.policies.grant_objects).
        """
        return [
            # Reads of items reach a task's and a job's partitions only (their events
            # included): a principal's tenant mapping and a tenant's limit and seats are
            # the operator's. Index queries carry no item key to condition on.
            iam.PolicyStatement(
                sid="ReadTasksAndJobs",
                actions=["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"],
                resources=[self.events_table.table_arn],
                conditions=leading_keys(TASK_PK_PREFIX, JOB_PK_PREFIX),
            ),
            iam.PolicyStatement(
                sid="QueryTaskIndexes",
                actions=["dynamodb:Query"],
                resources=[
                    f"{self.events_table.table_arn}/index/{index.name}"
                    for index in EVENTS_TABLE.indexes
                ],
            ),
            # Writes reach a task's and a job's items only (their events sit in the same
            # partitions): never a tenant's limit or seats, nor a principal's tenant
            # mapping, which would let a producer lift its limit or act for another tenant.
            iam.PolicyStatement(
                sid="WriteTasksAndJobs",
                actions=["dynamodb:PutItem", "dynamodb:UpdateItem"],
                resources=[self.events_table.table_arn],
                conditions=leading_keys(TASK_PK_PREFIX, JOB_PK_PREFIX),
            ),
            table_statement(self.definitions_table, DEFINITIONS_TABLE, ["GetItem"]),
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=self.tier_queue_arns),
            iam.PolicyStatement(actions=["events:PutEvents"], resources=[self.bus.event_bus_arn]),
        ]
