"""The stage's one dashboard: the fleet, then seed 000's metrics per tier and tenant.

Queue figures (waiting, in flight, delayed, oldest age, the DLQ) are SQS's own metrics
of each tier queue: free, and what the scheduler and the scaling read too, so the worker
does not emit copies. Claims, completions, failures, timeouts, processing time and tasks
in flight are the worker's EMF metrics with a `tier` or `tenant` dimension
(worker/telemetry.py); consumers are ECS's running tasks times the slots each has.
docs/operations.md ("Dashboard") describes every widget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.stacks.infrastructure import InfrastructureStack
from infra.stacks.metrics import dead_letters, per_tenant, tier_metric, worker_metric
from infra.stacks.worker import WorkerStack
from infra.stages import StageSettings


def build_dashboard(
    scope: Construct,
    *,
    settings: StageSettings,
    core: InfrastructureStack,
    worker: WorkerStack,
    functions: Mapping[str, lambda_.IFunction],
    alarms: Sequence[cloudwatch.IAlarm],
    period: Duration,
) -> cloudwatch.Dashboard:
    stage = settings.name
    dashboard = cloudwatch.Dashboard(
        scope, "Dashboard", dashboard_name=f"{settings.names.prefix}-overview"
    )
    queue = core.task_queue
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Task queue",
            left=[
                queue.metric_approximate_number_of_messages_visible(period=period),
                queue.metric_approximate_number_of_messages_not_visible(period=period),
                dead_letters(stage, period),
            ],
            right=[queue.metric_approximate_age_of_oldest_message(period=period)],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Worker tasks",
            left=[
                worker_metric(name, stage=stage, period=period)
                for name in ("TasksStarted", "TasksCompleted", "TasksFailed", "TasksTimedOut")
            ],
            right=[
                worker.service.metric_cpu_utilization(period=period),
                worker_metric("SlotsBusy", stage=stage, statistic="Average", period=period),
            ],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Task duration and queue wait (ms, p90)",
            left=[
                worker_metric("TaskDuration", stage=stage, statistic="p90", period=period),
                worker_metric("QueueWait", stage=stage, statistic="p90", period=period),
            ],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Lambda errors and throttles",
            left=[
                function.metric_errors(period=period, label=name)
                for name, function in functions.items()
            ],
            right=[
                function.metric_throttles(period=period, label=f"{name} throttled")
                for name, function in functions.items()
            ],
            width=12,
        ),
    )
    dashboard.add_widgets(*tier_widgets(core, worker, stage, period))
    dashboard.add_widgets(*tenant_widgets(stage, period))
    dashboard.add_widgets(
        cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24)
    )
    return dashboard


def tier_widgets(
    core: InfrastructureStack, worker: WorkerStack, stage: str, period: Duration
) -> list[cloudwatch.IWidget]:
    queues = core.tier_queues
    tiers = list(queues)
    dlq = core.dead_letter_queue

    def each(name: str, statistic: str = "Sum") -> list[cloudwatch.IMetric]:
        return [
            tier_metric(name, t, stage=stage, period=period, statistic=statistic) for t in tiers
        ]

    return [
        cloudwatch.GraphWidget(
            title="Waiting and delayed messages by tier",
            left=[q.metric_approximate_number_of_messages_visible(period=period, label=f"{t} waiting")
                  for t, q in queues.items()],
            right=[q.metric("ApproximateNumberOfMessagesDelayed", period=period,
                            statistic="Maximum", label=f"{t} delayed")
                   for t, q in queues.items()],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="In flight by tier (messages, and tasks running)",
            left=[q.metric_approximate_number_of_messages_not_visible(
                      period=period, label=f"{t} in flight") for t, q in queues.items()],
            right=each("TasksInFlight", "Maximum"),
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Oldest message age by tier, and the DLQ (s)",
            left=[q.metric_approximate_age_of_oldest_message(
                      period=period, statistic="Maximum", label=t) for t, q in queues.items()],
            right=[dlq.metric_approximate_age_of_oldest_message(
                       period=period, statistic="Maximum", label="dead letters")],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Dead letters (waiting, and settled by the DLQ processor)",
            left=[dlq.metric_approximate_number_of_messages_visible(
                      period=period, statistic="Maximum", label="DLQ depth"),
                  dead_letters(stage, period)],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Claims and completions by tier",
            left=each("TasksStarted"),
            right=each("TasksCompleted"),
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Failures and timeouts by tier",
            left=each("TasksFailed"),
            right=each("TasksTimedOut"),
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Processing time by tier (ms, p50 and p95)",
            left=each("TaskDuration", "p50"),
            right=each("TaskDuration", "p95"),
            width=12,
        ),
        cloudwatch.GraphWidget(
            # The lock's conditional write as each task met it: DynamoDB slowing
            # (throttled, a hot partition) shows here before it shows in the queue waits.
            title="Lock latency by tier (ms, p50 and p95)",
            left=each("LockLatency", "p50"),
            right=each("LockLatency", "p95"),
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Consumers: workers and slots",
            left=[running_workers(worker, period), consumers(worker, stage, period)],
            right=[worker_metric("SlotsBusy", stage=stage, statistic="Sum", period=period,
                                 label="slots busy (sum of reports)")],
            width=12,
        ),
    ]  # fmt: skip


def tenant_widgets(stage: str, period: Duration) -> list[cloudwatch.IWidget]:
    return [
        cloudwatch.GraphWidget(
            title=f"{name} by tenant (METRIC_TENANTS, the rest as (other))",
            left=[per_tenant(name, stage=stage, period=period)],
            width=8,
        )
        for name in ("TasksStarted", "TasksFailed", "TasksTimedOut")
    ]


def running_workers(worker: WorkerStack, period: Duration) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace="ECS/ContainerInsights",
        metric_name="RunningTaskCount",
        dimensions_map={
            "ClusterName": worker.cluster.cluster_name,
            "ServiceName": worker.service.service_name,
        },
        statistic="Average",
        period=period,
        label="workers",
    )


def consumers(worker: WorkerStack, stage: str, period: Duration) -> cloudwatch.MathExpression:
    """Running worker tasks times the slots each reports (`Slots`)."""
    using: dict[str, cloudwatch.IMetric] = {
        "running": running_workers(worker, period),
        "slots": worker_metric("Slots", stage=stage, statistic="Maximum", period=period),
    }
    return cloudwatch.MathExpression(
        expression="FILL(running, 0) * FILL(slots, 0)",
        using_metrics=using,
        period=period,
        label="slots (workers x slots each)",
    )
