"""Dispatcher Lambda: a terminal task event of a job task drives the job's DAG.

Triggered by the dispatcher rule (agentq.resources.DISPATCHER_RULE: Task Completed /
Failed / Timeout / Cancelled with a `jobId`). The event is only a trigger; agentq.jobs.dispatch
reconciles the job from the table, so EventBridge's at-least-once delivery and
Lambda's retries cannot enqueue a task twice. Errors talking to AWS raise (Lambda
retries the event); a malformed event or a missing job is logged and dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit

from agentq.errors import InvalidInput, NotFound
from agentq.events import Event
from lambdas._common import powertools

if TYPE_CHECKING:
    from agentq.client import AgentqClient
    from agentq.config import Settings

logger, metrics = powertools("dispatcher")


@functools.lru_cache(maxsize=4)
def _client_for(settings: Settings) -> AgentqClient:
    # Built on the first invocation (never at import) and kept for the warm container.
    from agentq.client import AgentqClient

    return AgentqClient.from_env(settings)


def _client() -> AgentqClient:
    from agentq.config import Settings  # pydantic: with the client, not at import

    return _client_for(Settings.from_env())


def warm() -> None:
    """What the first invocation builds: settings, boto3 and the client's AWS clients."""
    _client()


# No @logger.inject_lambda_context: tests call the handler without a Lambda context,
# which that decorator cannot take.
@metrics.log_metrics
def handler(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        detail = event["detail"]
        task_event = Event.from_detail(detail, event.get("detail-type"))
    except (KeyError, TypeError, InvalidInput) as error:
        logger.error("dropping malformed dispatcher event", extra={"error": str(error)})
        metrics.add_metric(name="EventsInvalid", unit=MetricUnit.Count, value=1)
        return {"status": "invalid", "error": str(error)}
    if not task_event.job_id:
        metrics.add_metric(name="EventsIgnored", unit=MetricUnit.Count, value=1)
        return {"status": "ignored", "reason": "not a job task"}
    try:
        outcome = _client().dispatcher.on_task_event(task_event)
    except NotFound as error:
        logger.error("job event for a missing job", extra={"error": str(error)})
        metrics.add_metric(name="JobsMissing", unit=MetricUnit.Count, value=1)
        return {"status": "missing", "error": str(error)}
    logger.info("dispatched", extra=outcome.to_dict())
    metrics.add_metric(name="TasksEnqueued", unit=MetricUnit.Count, value=len(outcome.enqueued))
    if outcome.closed:
        metrics.add_metric(name="JobsClosed", unit=MetricUnit.Count, value=1)
    return {"status": "ok", **outcome.to_dict()}
