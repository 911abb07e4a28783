"""Dispatcher Lambda: a terminal task event of a job task drives the job's DAG.

Triggered by the dispatcher rule (agentq.resources.DISPATCHER_RULE: Task Completed /
Failed / Timeout with a `jobId`). The event is only a trigger; agentq.jobs.dispatch
reconciles the job from the table, so EventBridge's at-least-once delivery and
Lambda's retries cannot enqueue a task twice. Errors talking to AWS raise (Lambda
retries the event); a malformed event or a missing job is logged and dropped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.errors import InvalidInput, NotFound
from agentq.events import Event

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _client_for(settings: Settings) -> AgentqClient:
    # Built on the first invocation (never at import) and kept for the warm container.
    return AgentqClient.from_env(settings)


def _client() -> AgentqClient:
    return _client_for(Settings.from_env())


def warm() -> None:
    """What the first invocation builds: settings, boto3 and the client's AWS clients."""
    _client()


def handler(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        detail = event["detail"]
        task_event = Event.from_detail(detail, event.get("detail-type"))
    except (KeyError, TypeError, InvalidInput) as error:
        logger.error("dropping malformed dispatcher event: %s", error)
        return {"status": "invalid", "error": str(error)}
    if not task_event.job_id:
        return {"status": "ignored", "reason": "not a job task"}
    try:
        outcome = _client().dispatcher.on_task_event(task_event)
    except NotFound as error:
        logger.error("job event for a missing job: %s", error)
        return {"status": "missing", "error": str(error)}
    logger.info("dispatched", extra=outcome.to_dict())
    return {"status": "ok", **outcome.to_dict()}
