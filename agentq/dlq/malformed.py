"""Dead letters no worker could parse: closed out once, under the id they carry.

A message that reaches the DLQ unparsed (a worker died before rejecting it, or a
producer wrote to the DLQ) still names a task when its request id is readable. That
task ends FAILED with the cause and one `Task Failed`, as a worker's rejection would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentq.envelope import TaskEnvelope, identity_hint
from agentq.events import task_event
from agentq.publisher import EventPublisher
from agentq.security import sanitize_error_message
from agentq.states import LIVE_STATES, TaskState
from agentq.store import TaskStore

# The definition recorded for a task whose only message could not be parsed.
UNPARSED_DEFINITION: Final = "_unparsed"
INVALID_MESSAGE: Final = "invalid message"


def close_out_malformed(
    tasks: TaskStore,
    publisher: EventPublisher,
    body: str,
    attributes: Mapping[str, Any],
    *,
    request_id: str,
    message_id: str,
    problem: str,
    default_tenant: str,
) -> str:
    """End the task named by an unparseable message; returns what was done, for the
    archive record.

    The STATE item is written FAILED (created first when no producer wrote it), so a
    redelivered copy finds it terminal and sends nothing again; a task that is finished,
    or live under a lease, is left as it is.
    """
    tenant = identity_hint(body, attributes)[1] or default_tenant
    error = {"category": "validation", "retryable": False,
             "message": sanitize_error_message(problem), "reason": INVALID_MESSAGE}  # fmt: skip
    if tasks.get(tenant, request_id) is None:
        placeholder = TaskEnvelope(request_id=request_id, tenant=tenant,
                                   definition=UNPARSED_DEFINITION)  # fmt: skip
        tasks.create(placeholder)
    record = tasks.transition(
        tenant, request_id, from_states=LIVE_STATES, to_state=TaskState.FAILED,
        unless_lease_live=True, fields={"error": error, "reason": INVALID_MESSAGE},
    )  # fmt: skip
    if record is None:
        return f"{problem} (task left as it is)"
    publisher.publish(
        task_event(
            "Task Failed",
            request_id=request_id,
            tenant=tenant,
            job_id=record.job_id,
            attempt=record.attempt,
            error=error,
            reason=INVALID_MESSAGE,
            messageId=message_id,
        )
    )
    return problem
