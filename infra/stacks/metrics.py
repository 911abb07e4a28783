"""agentq's CloudWatch metrics as the alarms and the dashboard select them.

Every agentq metric carries `service` and `stage`; the worker's per-tier and per-tenant
sets add `tier` or `tenant` (worker/telemetry.py). A dimension set is its own metric in
CloudWatch, so each of these names exactly the set the worker emits.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Final

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from agentq.dlq import DlqOutcome

NAMESPACE: Final = "agentq"
WORKER_SERVICE: Final = "worker"
# DLQ-processor outcomes that mean a task's message was dead-lettered and settled
# ("lease-live" comes back until its holder ends, "archived" is a redrive's record,
# "returned" went back to the task queue with attempts left: the task goes on).
DEAD_LETTER_OUTCOMES: Final = tuple(
    o for o in typing.get_args(DlqOutcome) if o not in ("lease-live", "archived", "returned")
)


def agentq_metric(
    name: str,
    *,
    service: str,
    stage: str,
    statistic: str = "Sum",
    period: Duration,
    dimensions: Mapping[str, str] | None = None,
    label: str | None = None,
) -> cloudwatch.Metric:
    """One of agentq's EMF metrics (the worker's, or a Lambda's `agentq-<function>`)."""
    return cloudwatch.Metric(
        namespace=NAMESPACE,
        metric_name=name,
        dimensions_map={"service": service, "stage": stage, **(dimensions or {})},
        statistic=statistic,
        period=period,
        label=label,
    )


def worker_metric(
    name: str,
    *,
    stage: str,
    statistic: str = "Sum",
    period: Duration,
    dimensions: Mapping[str, str] | None = None,
    label: str | None = None,
) -> cloudwatch.Metric:
    """One of the worker's EMF metrics (TasksStarted, TasksFailed, TaskDuration, ...)."""
    return agentq_metric(
        name, service=WORKER_SERVICE, stage=stage, statistic=statistic, period=period,
        dimensions=dimensions, label=label,
    )  # fmt: skip


def tier_metric(
    name: str, tier: str, *, stage: str, period: Duration, statistic: str = "Sum"
) -> cloudwatch.Metric:
    """A worker metric of one priority tier's set."""
    label = tier if statistic == "Sum" else f"{tier} {statistic}"
    return worker_metric(name, stage=stage, statistic=statistic, period=period,
                         dimensions={"tier": tier}, label=label)  # fmt: skip


def per_tenant(name: str, *, stage: str, period: Duration) -> cloudwatch.MathExpression:
    """Every tenant group's `name` (the tenants of METRIC_TENANTS and `(other)`), found
    by a search: the stack need not know which tenants a deployment names."""
    seconds = int(period.to_seconds())
    query = (
        f'{{{NAMESPACE},service,stage,tenant}} MetricName="{name}" '
        f'service="{WORKER_SERVICE}" stage="{stage}"'
    )
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{query}', 'Sum', {seconds})",
        using_metrics={},
        period=period,
        label=name,
    )


def dead_letters(stage: str, period: Duration) -> cloudwatch.MathExpression:
    """Dead letters the DLQ processor settled, whatever the outcome's name."""
    using = {
        f"d{index}": agentq_metric(
            f"DeadLetters_{outcome}", service="agentq-dlq-processor", stage=stage, period=period
        )
        for index, outcome in enumerate(DEAD_LETTER_OUTCOMES)
    }
    return cloudwatch.MathExpression(
        expression=" + ".join(f"FILL({key}, 0)" for key in using),
        using_metrics=using,
        period=period,
        label="tasks dead-lettered",
    )
