"""health-check: scheduled sweep for stuck, overtime and starving tasks and the DLQ.

Invoked by an EventBridge schedule (the rate is per stage; off in dev by default) or
by the local host's timer. Queries the status index only, never scans. Posts at most
one Slack message per run, with findings not alerted before; with no Slack token it
logs the alert and says so.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.alerts.slack import alert, notifier
from agentq.health import AlertLedger, HealthChecker
from agentq.store import EventStore, TaskStore
from lambdas._common import powertools, runtime, warm_clients

logger, metrics = powertools("health-check")


def warm() -> None:
    """What every invocation builds: settings, boto3 and the clients the sweep uses.

    slack-sdk is not part of it: it loads only when an alert is actually sent.
    """
    settings = runtime().settings
    warm_clients(
        "dynamodb",
        "sqs",
        *(() if settings.local else ("cloudwatch",)),
        *(("secretsmanager",) if settings.slack_token_secret_arn else ()),
    )


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    rt = runtime()
    settings = rt.settings.require("table_name")
    clients = rt.clients
    table = settings.required("table_name")
    checker = HealthChecker(
        tasks=TaskStore(clients.dynamodb, table),
        events=EventStore(clients.dynamodb, table, app_name=settings.app_name),
        sqs=clients.sqs,
        settings=settings,
        cloudwatch=None if settings.local else clients.get("cloudwatch"),
    )
    report = checker.check()
    for condition, count in report.counts().items():
        metrics.add_metric(name=f"Findings_{condition}", unit=MetricUnit.Count, value=count)
    if report.dlq is not None:
        metrics.add_metric(name="DlqDepth", unit=MetricUnit.Count, value=report.dlq.depth)
    secrets = clients.get("secretsmanager") if settings.slack_token_secret_arn else None
    sink = notifier(settings, secrets)
    sent = alert(
        report,
        AlertLedger(clients.dynamodb, table, keep_days=settings.alert_dedupe_days),
        sink,
        stage=settings.stage,
    )
    metrics.add_metric(name="AlertsSent", unit=MetricUnit.Count, value=len(sent))
    logger.info(
        "health check done",
        extra={"findings": report.counts(), "alerted": len(sent), "destination": sink.destination,
               "dlqDepth": report.dlq.depth if report.dlq else None},
    )  # fmt: skip
    return {
        "findings": report.counts(),
        "alerted": [f"{f.condition}:{f.subject}" for f in sent],
        "destination": sink.destination,
        "dlqDepth": report.dlq.depth if report.dlq else None,
    }
