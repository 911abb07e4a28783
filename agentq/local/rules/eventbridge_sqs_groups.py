"""EventBridge puts a rule's events on a standard SQS queue with the target's
`SqsParameters.MessageGroupId`, read from the event when it is a dynamic path.

AWS (EventBridge User Guide, "Event bus targets"; API reference, `SqsParameters`): the
parameters are for "a target that is an Amazon SQS fair or FIFO queue", and a target
parameter may be a dynamic path: a value that is wholly a JSON path (`$.detail.tenant`)
is replaced at delivery by the event's data at that path. agentq's `task-requested`
rule (agentq.resources) sets the tenant as MessageGroupId that way, so the task queue's
fair queues (agentq.local.rules.fair_queues) see EventBridge-submitted tasks' tenants.

moto passes the value on as written (every message's group would be the text
`$.detail.tenant`) and, for a standard queue, fails the delivery looking up the FIFO
queue's `ContentBasedDeduplication` attribute. Here a dynamic path is read from the
event (dot notation; a path that does not resolve to a string sends no group: AWS does
not document that case, and agentq's rules never meet it) and a standard queue gets the
message with its group. FIFO queues keep moto's handling.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from agentq.local import moto_guards

PATCHER: Final = "agentq/local/rules/eventbridge_sqs_groups.py"


def resolve_group(value: str | None, event: Mapping[str, Any]) -> str | None:
    """A target's MessageGroupId for `event`: a dynamic path (`$.a.b`) read from it."""
    if not value or not value.startswith("$."):
        return value
    found: Any = event
    for step in value[2:].split("."):
        if not isinstance(found, Mapping) or step not in found:
            return None
        found = found[step]
    return found if isinstance(found, str) and found else None


def _send_to_sqs_queue(
    self: Any,
    resource_id: str,
    event: dict[str, Any],
    group_id: str | None = None,
    *,
    original: Callable[..., None],
) -> None:
    from moto.core.utils import iso_8601_datetime_without_milliseconds, utcfromtimestamp
    from moto.sqs import sqs_backends

    group = resolve_group(group_id, event)
    backend = sqs_backends[self.account_id][self.region_name]
    if group is None or backend.get_queue(resource_id).fifo_queue:
        original(self, resource_id, event, group)
        return
    # moto's own steps for the message, with the group a standard queue keeps.
    if "time" in event:
        event["time"] = iso_8601_datetime_without_milliseconds(
            utcfromtimestamp(float(event["time"]))  # type: ignore[arg-type]  # as moto does
        )
    backend.send_message(queue_name=resource_id, message_body=json.dumps(event), group_id=group)


def install() -> None:
    """Patch moto's EventBridge Rule._send_to_sqs_queue. Idempotent."""
    rule = _guarded()
    send = vars(rule)["_send_to_sqs_queue"]
    if hasattr(send, "reads_group_paths"):
        return

    def patched(
        self: Any, resource_id: str, event: dict[str, Any], group_id: str | None = None
    ) -> None:
        _send_to_sqs_queue(self, resource_id, event, group_id, original=send)

    patched.reads_group_paths = True  # type: ignore[attr-defined]
    rule._send_to_sqs_queue = patched


def _guarded() -> Any:
    """moto's EventBridge Rule, whose `_send_to_sqs_queue(self, resource_id, event,
    group_id)` formats the event's time and sends it with `send_message`."""
    import moto.events.models as events_models

    rule = getattr(events_models, "Rule", None)
    if not isinstance(rule, type):
        raise moto_guards.refuse("moto", "moto.events.models.Rule is gone", PATCHER)
    send = vars(rule).get("_send_to_sqs_queue")
    if send is None:
        raise moto_guards.refuse("moto", "moto.events.models.Rule._send_to_sqs_queue is gone",
                                 PATCHER)  # fmt: skip
    if hasattr(send, "reads_group_paths"):
        return rule
    if moto_guards.parameters(send) != ["self", "resource_id", "event", "group_id"]:
        raise moto_guards.refuse("moto", "Rule._send_to_sqs_queue(...) changed", PATCHER)
    # The send and the target loop that reads the group for it.
    source = moto_guards.code(send) + moto_guards.code(vars(rule).get("send_to_targets", ""))
    for step in ('if"time"inevent:', "message_body=json.dumps(event)", "group_id=group_id",
                 'target.get("SqsParameters",{}).get("MessageGroupId")'):  # fmt: skip
        if step not in source:
            raise moto_guards.refuse("moto", f"Rule's SQS delivery moved ({step})", PATCHER)
    return rule
