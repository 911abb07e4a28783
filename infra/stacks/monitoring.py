"""Alarms and the stage's one dashboard.

Alarms: DLQ not empty, age of the oldest task message, errors of each Lambda, and the
worker's own EMF metrics (namespace `agentq`, dimension service=worker) for failed
and timed-out tasks. Every alarm notifies one SNS topic (KMS-encrypted with a key
whose policy lets CloudWatch publish; the AWS-managed SNS key would not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.stacks.infrastructure import InfrastructureStack
from infra.stacks.worker import WorkerStack
from infra.stages import StageSettings

WORKER_NAMESPACE: Final = "agentq"
WORKER_DIMENSIONS: Final = {"service": "worker"}


def worker_metric(name: str, *, statistic: str = "Sum", period: Duration) -> cloudwatch.Metric:
    """One of the worker's EMF metrics (TasksStarted, TasksFailed, TaskDuration, ...)."""
    return cloudwatch.Metric(
        namespace=WORKER_NAMESPACE,
        metric_name=name,
        dimensions_map=WORKER_DIMENSIONS,
        statistic=statistic,
        period=period,
    )


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
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        limits = settings.alarms
        period = Duration.minutes(limits.period_minutes)
        prefix = settings.names.prefix

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
        if limits.email:
            self.topic.add_subscription(subscriptions.EmailSubscription(limits.email))
        notify = actions.SnsAction(self.topic)

        self.alarms: list[cloudwatch.Alarm] = []

        def alarm(
            construct_id: str, metric: cloudwatch.IMetric, threshold: float, description: str
        ) -> cloudwatch.Alarm:
            created = cloudwatch.Alarm(
                self,
                construct_id,
                alarm_name=f"{prefix}-{construct_id}",
                alarm_description=description,
                metric=metric,
                threshold=threshold,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            created.add_alarm_action(notify)
            self.alarms.append(created)
            return created

        alarm(
            "dlq-not-empty",
            core.dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=period, statistic="Maximum"
            ),
            limits.dlq_messages,
            "Task messages reached the dead-letter queue (see `agentq dlq`)",
        )
        for tier, tier_queue in core.tier_queues.items():
            alarm(
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
            alarm(
                f"{name}-errors",
                function.metric_errors(period=period, statistic="Sum"),
                limits.lambda_errors,
                f"The {name} Lambda raised errors (its log group has the tracebacks)",
            )
        for name, queue in failed_events.items():
            alarm(
                f"{name}-failed-events",
                queue.metric_approximate_number_of_messages_visible(
                    period=period, statistic="Maximum"
                ),
                1,
                f"Events the {name} Lambda could not process wait in its failed-events queue",
            )
        alarm(
            "worker-task-failures",
            worker_metric("TasksFailed", period=period),
            limits.task_failures,
            "Workers reported terminal task failures (EMF metric TasksFailed)",
        )
        alarm(
            "worker-task-timeouts",
            worker_metric("TasksTimedOut", period=period),
            limits.task_timeouts,
            "Workers killed tasks that ran past their timeout (EMF metric TasksTimedOut)",
        )

        alarm(
            "reconciler-repairs",
            cloudwatch.Metric(
                namespace=WORKER_NAMESPACE,
                metric_name="Repairs",
                dimensions_map={"service": "agentq-reconciler"},
                statistic="Sum",
                period=period,
            ),
            1,
            "The reconciler re-sent lost messages or moved stalled jobs on: something "
            "upstream lost them (the health check's Slack alert names each one)",
        )

        self.dashboard = self._dashboard(settings, core, worker, functions, period)

    def _dashboard(
        self,
        settings: StageSettings,
        core: InfrastructureStack,
        worker: WorkerStack,
        functions: Mapping[str, lambda_.IFunction],
        period: Duration,
    ) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{settings.names.prefix}-overview"
        )
        queue = core.task_queue
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Task queue",
                left=[
                    queue.metric_approximate_number_of_messages_visible(period=period),
                    queue.metric_approximate_number_of_messages_not_visible(period=period),
                    core.dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=period, label="DLQ visible"
                    ),
                ],
                right=[queue.metric_approximate_age_of_oldest_message(period=period)],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Worker tasks",
                left=[
                    worker_metric(name, period=period)
                    for name in ("TasksStarted", "TasksCompleted", "TasksFailed", "TasksTimedOut")
                ],
                right=[
                    worker.service.metric_cpu_utilization(period=period),
                    worker_metric("SlotsBusy", statistic="Average", period=period),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Task duration and queue wait (ms, p90)",
                left=[
                    worker_metric("TaskDuration", statistic="p90", period=period),
                    worker_metric("QueueWait", statistic="p90", period=period),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Lambda errors",
                left=[
                    function.metric_errors(period=period, label=name)
                    for name, function in functions.items()
                ],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms), width=24),
        )
        return dashboard
