"""Alarms and the stage's one dashboard.

Each alarm is described in docs/operations.md ("CloudWatch alarms"); every one selects
its own stage's metrics (every agentq metric carries the stage as a dimension) and
notifies one SNS topic, KMS-encrypted with a key whose policy lets CloudWatch publish
(the AWS-managed SNS key would not), which reaches the stage's e-mail and Slack
subscribers. A production stage without a subscriber fails synth (infra/stages.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_chatbot as chatbot
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.resources import DEFINITIONS_TABLE, EVENTS_TABLE
from infra.stacks.dashboard import build_dashboard
from infra.stacks.infrastructure import InfrastructureStack
from infra.stacks.metrics import (
    DEAD_LETTER_OUTCOMES,
    agentq_metric,
    dead_letters,
    worker_metric,
)
from infra.stacks.worker import WorkerStack
from infra.stages import StageSettings

# The metric helpers moved to infra/stacks/metrics.py; their names stay importable here.
__all__ = ["DEAD_LETTER_OUTCOMES", "MonitoringStack", "dead_letters", "worker_metric"]


class MonitoringStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        core: InfrastructureStack,
        worker: WorkerStack,
        functions: Mapping[str, lambda_.IFunction],
        failed_events: Mapping[str, sqs.IQueue],
        rules: Mapping[str, tuple[str, str | None]],
        api: apigateway.RestApi,
        **kwargs: Any,
    ) -> None:
        """`rules`: label -> (rule name, its custom bus's name, None for the default bus)."""
        super().__init__(scope, construct_id, **kwargs)
        limits = settings.alarms
        period = Duration.minutes(limits.period_minutes)
        prefix = settings.names.prefix
        stage = settings.name

        key = kms.Key(
            self,
            "AlarmTopicKey",
            enable_key_rotation=True,
            description=f"{prefix} alarm topic encryption",
            removal_policy=settings.removal_policy,
        )
        key.grant(
            iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*"
        )
        self.topic = sns.Topic(
            self, "Alarms", topic_name=f"{prefix}-alarms", master_key=key, enforce_ssl=True
        )
        self._subscribe(settings)
        self._notify = actions.SnsAction(self.topic)
        self._prefix = prefix
        self.alarms: list[cloudwatch.Alarm] = []

        self._alarm(
            "dead-lettered-tasks",
            dead_letters(stage, period),
            limits.dlq_messages,
            "Tasks were dead-lettered: their message failed maxReceiveCount times and the "
            "DLQ processor closed them out (see `agentq dlq`)",
        )
        self._alarm(
            "dlq-not-draining",
            dead_letters_waiting(core.dead_letter_queue, period),
            1,
            "Dead letters have stayed in the DLQ (received or not) for "
            f"{limits.dlq_stuck_periods} periods: the DLQ processor keeps failing on "
            "them, or their task's lease is still live",
            evaluation_periods=limits.dlq_stuck_periods,
        )
        for tier, tier_queue in core.tier_queues.items():
            self._alarm(
                "oldest-task-message"
                if tier_queue is core.task_queue
                else f"oldest-{tier}-message",
                tier_queue.metric_approximate_age_of_oldest_message(
                    period=period, statistic="Maximum"
                ),
                limits.oldest_message_age_s,
                f"A {tier}-priority task message has waited too long: workers down, scaled "
                "to max, or stuck",
            )
        for name, function in functions.items():
            self._alarm(
                f"{name}-errors",
                function.metric_errors(period=period, statistic="Sum"),
                limits.lambda_errors,
                f"The {name} Lambda raised errors (its log group has the tracebacks)",
            )
            self._alarm(
                f"{name}-throttles",
                function.metric_throttles(period=period, statistic="Sum"),
                limits.lambda_throttles,
                f"Invocations of the {name} Lambda were throttled (account or reserved "
                "concurrency exhausted)",
            )
        for label, table, spec in (
            ("events-table", core.events_table, EVENTS_TABLE),
            ("definitions-table", core.definitions_table, DEFINITIONS_TABLE),
        ):
            for index in (None, *(i.name for i in spec.indexes)):
                self._alarm(
                    f"{label}-throttles" if index is None else f"{label}-{index}-throttles",
                    table_throttles(table.table_name, index, period),
                    limits.dynamodb_throttles,
                    f"DynamoDB throttled requests to the {label}"
                    + (f"'s {index} index" if index else "")
                    + " (on-demand tables throttle past their table or partition limits; "
                    "the SDK retries, so sustained throttling means lost time or failures)",
                )
        for name, queue in failed_events.items():
            self._alarm(
                f"{name}-failed-events",
                queue.metric_approximate_number_of_messages_visible(
                    period=period, statistic="Maximum"
                ),
                1,
                f"Events the {name} Lambda could not process wait in its failed-events queue",
            )
        self._alarm(
            "task-requested-undelivered",
            core.rule_dead_letters.metric_approximate_number_of_messages_visible(
                period=period, statistic="Maximum"
            ),
            1,
            "'Task Requested' events EventBridge could not put on the task queue wait in "
            "the rule's dead-letter queue",
        )
        for label, (rule_name, bus_name) in rules.items():
            self._alarm(
                f"{label}-rule-failed-invocations",
                rule_failed_invocations(rule_name, bus_name, period),
                1,
                f"EventBridge gave up invoking the {label} rule's target",
            )
        self._alarm(
            "workers-below-desired",
            workers_below_desired(worker, period),
            1,
            "Fewer worker tasks run than the service wants: tasks fail to start (image, "
            "secret placeholder, health check) or keep crashing",
            evaluation_periods=limits.below_desired_periods,
        )
        self._alarm(
            "producer-api-5xx",
            api.metric_server_error(period=period, statistic="Sum"),
            limits.api_server_errors,
            "The producer API answered 5xx (the producer-api Lambda failed or timed out)",
        )
        self._alarm(
            "worker-task-failures",
            worker_metric("TasksFailed", stage=stage, period=period),
            limits.task_failures,
            "Workers reported terminal task failures (EMF metric TasksFailed)",
        )
        self._alarm(
            "worker-task-timeouts",
            worker_metric("TasksTimedOut", stage=stage, period=period),
            limits.task_timeouts,
            "Workers killed tasks that ran past their timeout (EMF metric TasksTimedOut)",
        )

        self._alarm(
            "reconciler-repairs",
            agentq_metric("Repairs", service="agentq-reconciler", stage=stage, period=period),
            1,
            "The reconciler re-sent lost messages or moved stalled jobs on: something "
            "upstream lost them (the health check's Slack alert names each one)",
        )

        self.dashboard = build_dashboard(
            self, settings=settings, core=core, worker=worker, functions=functions,
            alarms=self.alarms, period=period,
        )  # fmt: skip

    def _subscribe(self, settings: StageSettings) -> None:
        alarms = settings.alarms
        for email in alarms.emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        for channel in alarms.slack_channels:
            chatbot.SlackChannelConfiguration(
                self,
                f"Slack-{channel.channel_id}",
                slack_channel_configuration_name=f"{settings.names.prefix}-{channel.channel_id}",
                slack_workspace_id=channel.workspace_id,
                slack_channel_id=channel.channel_id,
                notification_topics=[self.topic],
            )
        if not alarms.has_subscriber:
            cdk.Annotations.of(self).add_warning_v2(
                "agentq:alarms-unsubscribed",
                f"stage {settings.name}: the alarm topic has no subscriber, so alarms reach "
                "nobody (pass -c alarm_emails=... or -c alarm_slack=TEAM/CHANNEL)",
            )

    def _alarm(
        self,
        construct_id: str,
        metric: cloudwatch.IMetric,
        threshold: float,
        description: str,
        *,
        evaluation_periods: int = 1,
    ) -> cloudwatch.Alarm:
        created = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=f"{self._prefix}-{construct_id}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        created.add_alarm_action(self._notify)
        self.alarms.append(created)
        return created


def rule_failed_invocations(
    rule_name: str, bus_name: str | None, period: Duration
) -> cloudwatch.Metric:
    # A rule on a custom bus reports with both dimensions, one on the default bus with one.
    dimensions = {"RuleName": rule_name}
    if bus_name is not None:
        dimensions["EventBusName"] = bus_name
    return cloudwatch.Metric(
        namespace="AWS/Events",
        metric_name="FailedInvocations",
        dimensions_map=dimensions,
        statistic="Sum",
        period=period,
    )


def dead_letters_waiting(queue: sqs.IQueue, period: Duration) -> cloudwatch.MathExpression:
    """Every message in the DLQ, in flight or not: a message the processor keeps failing
    is mostly in flight, and after three receives SQS drops it from the oldest-age metric."""
    using = {
        "visible": queue.metric_approximate_number_of_messages_visible(
            period=period, statistic="Maximum"
        ),
        "inflight": queue.metric_approximate_number_of_messages_not_visible(
            period=period, statistic="Maximum"
        ),
    }
    return cloudwatch.MathExpression(
        expression="FILL(visible, 0) + FILL(inflight, 0)",
        using_metrics=using,
        period=period,
        label="dead letters in the DLQ",
    )


def table_throttles(
    table_name: str, index: str | None, period: Duration
) -> cloudwatch.MathExpression:
    """Read and write throttle events of a table, or of one of its global indexes (an
    index throttled on writes throttles the table's writes too)."""
    dimensions = {"TableName": table_name}
    if index is not None:
        dimensions["GlobalSecondaryIndexName"] = index
    return _metric_sum(
        "AWS/DynamoDB", dimensions, "Sum", period,
        reads="ReadThrottleEvents", writes="WriteThrottleEvents",
        expression="FILL(reads, 0) + FILL(writes, 0)", label="throttled requests",
    )  # fmt: skip


def workers_below_desired(worker: WorkerStack, period: Duration) -> cloudwatch.MathExpression:
    dimensions = {
        "ClusterName": worker.cluster.cluster_name,
        "ServiceName": worker.service.service_name,
    }
    return _metric_sum(
        "ECS/ContainerInsights", dimensions, "Average", period,
        desired="DesiredTaskCount", running="RunningTaskCount",
        expression="FILL(desired, 0) - FILL(running, 0)", label="worker tasks missing",
    )  # fmt: skip


def _metric_sum(
    namespace: str,
    dimensions: Mapping[str, str],
    statistic: str,
    period: Duration,
    *,
    expression: str,
    label: str,
    **metrics: str,
) -> cloudwatch.MathExpression:
    """`expression` over metrics of one namespace and dimensions (keyword: the metric's
    id in the expression, value: its name)."""
    using = {
        key: cloudwatch.Metric(
            namespace=namespace,
            metric_name=name,
            dimensions_map=dict(dimensions),
            statistic=statistic,
            period=period,
        )
        for key, name in metrics.items()
    }
    return cloudwatch.MathExpression(
        expression=expression, using_metrics=using, period=period, label=label
    )
