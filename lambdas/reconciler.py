"""reconciler: scheduled sweep that repairs what no event will ever fix.

Invoked by an EventBridge schedule (per stage) or by the local host's timer. Reads the
status index only (agentq.reconcile); re-sends lost messages and moves stalled jobs on
through the dispatcher's own idempotent reconcile. Each repair is an event and a
metric; the health check alerts on the events. A failed check is reported and left
for the next run, never retried inside this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas._common import powertools, runtime, warm_clients

if TYPE_CHECKING:
    from agentq.reconcile import Reconciler

logger, metrics = powertools("reconciler")


def warm() -> None:
    """What every invocation builds: settings, boto3 and the clients the sweep uses, and
    what it imports (the client and the reconciler), so "ready" counts them."""
    warm_clients("dynamodb", "sqs", "events", "s3")
    import agentq.client
    import agentq.reconcile  # noqa: F401


def reconciler() -> Reconciler:
    # The client and the reconciler (job specs: pydantic) load with the first invocation.
    from agentq.client import AgentqClient
    from agentq.reconcile import Reconciler

    rt = runtime()
    settings = rt.settings.require("table_name", "queue_url", "bus_name", "bucket")
    client = AgentqClient.from_env(settings, aws=rt.clients)
    return Reconciler(
        settings=settings,
        tasks=client.tasks,
        jobs=client.jobs,
        dispatcher=client.dispatcher,
        publisher=client.publisher,
        dynamodb=rt.clients.dynamodb,
        sqs=rt.clients.sqs,
    )


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from agentq.reconcile import REPAIR_KINDS

    report = reconciler().run()
    counts = report.counts()
    # Every kind every run, zeros included: an alarm on a metric needs its data points.
    for kind in REPAIR_KINDS:
        metrics.add_metric(name=f"Repairs_{kind}", unit=MetricUnit.Count, value=counts.get(kind, 0))
    metrics.add_metric(name="Repairs", unit=MetricUnit.Count, value=len(report.repairs))
    metrics.add_metric(name="ReconcileErrors", unit=MetricUnit.Count, value=len(report.errors))
    for repair in report.repairs:
        logger.warning("repaired", extra=repair.to_dict())
    if report.errors:
        logger.error("reconciler left work for the next run", extra={"errors": report.errors[:20]})
    logger.info("reconciler done", extra={"repairs": counts, "errors": len(report.errors)})
    return report.to_dict()
