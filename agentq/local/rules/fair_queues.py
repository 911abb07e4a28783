"""SQS fair queues: a tenant with a disproportionate share of the in-flight messages
yields to quiet tenants on receive.

AWS (Amazon SQS Developer Guide, "How Amazon SQS fair queues work"): fair queues
identify tenants by each message's `MessageGroupId`; a message without one is a tenant
of its own. A tenant is a noisy neighbor when it holds more than 10 % of the queue's
in-flight messages and at least 30 of its own, or when its recent share of consumers'
processing time exceeds 10 %. Once one is detected, consumers receive quiet tenants'
messages whenever any are available; among several noisy tenants, the one with the
fewest messages in flight first. Noisy messages are neither dropped nor throttled: with
no quiet message waiting they are received as usual. It applies to standard queues.

moto returns visible messages in the order they were sent. Here a receive of a
standard queue meets them in fair order instead: quiet tenants' messages first (in
sent order), then noisy tenants' by their in-flight count. Processing time is the time
in flight of the tenant's messages now in flight (what consumers hold at this moment;
AWS's "recent" share also remembers messages already deleted). Detection is worked out
anew at every receive, so a tenant is quiet again as soon as its share drops.

`AGENTQ_LOCAL_FAIR_QUEUES=0` in the moto server's environment turns the rule off (the
benchmark's "without fair queues" figure); it is on otherwise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from agentq.local import moto_guards

SWITCH: Final = "AGENTQ_LOCAL_FAIR_QUEUES"
CONCURRENCY_SHARE: Final = 0.10
CONCURRENCY_MIN: Final = 30
PROCESSING_SHARE: Final = 0.10
PATCHER: Final = "agentq/local/rules/fair_queues.py"


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in {"0", "false", "no", "off"}


def _tenant(message: Any) -> object:
    # A message without a group is a tenant of its own.
    group = getattr(message, "group_id", None)
    return group if group else ("message", id(message))


def noisy_tenants(in_flight: Iterable[Any], now: float) -> dict[object, int]:
    """The noisy tenants among the messages `in_flight`, each with its in-flight count."""
    counts: dict[object, int] = {}
    held_s: dict[object, float] = {}
    for message in in_flight:
        tenant = _tenant(message)
        counts[tenant] = counts.get(tenant, 0) + 1
        received_at = getattr(message, "agentq_received_at", now)
        held_s[tenant] = held_s.get(tenant, 0.0) + max(0.0, now - received_at)
    total = sum(counts.values())
    total_s = sum(held_s.values())
    return {
        tenant: count
        for tenant, count in counts.items()
        if (count >= CONCURRENCY_MIN and count > CONCURRENCY_SHARE * total)
        or (total_s > 0 and held_s[tenant] > PROCESSING_SHARE * total_s)
    }


def fair_order(messages: Sequence[Any], noisy: dict[object, int]) -> list[Any]:
    """`messages` (visible, in sent order) in the order a fair queue hands them out."""
    if not noisy:
        return list(messages)
    position = {id(message): index for index, message in enumerate(messages)}

    def key(message: Any) -> tuple[int, int, int]:
        tenant = _tenant(message)
        if tenant not in noisy:
            return (0, 0, position[id(message)])
        return (1, noisy[tenant], position[id(message)])

    return sorted(messages, key=key)


def _fair_messages(self: Any, *, original: Callable[[Any], list[Any]]) -> list[Any]:
    visible: list[Any] = original(self)
    if self.fifo_queue or len(visible) < 2 or not enabled():
        return visible
    in_flight = [
        message
        for message in self._messages
        if message.approximate_receive_count > 0 and not message.visible
    ]
    return fair_order(visible, noisy_tenants(in_flight, time.time()))


def _stamped_receive(
    self: Any, visibility_timeout: int | None = None, *, original: Callable[..., None]
) -> None:
    original(self, visibility_timeout)
    self.agentq_received_at = time.time()


def install() -> None:
    """Patch moto's SQS Queue.messages (what a receive walks) and Message.mark_received
    (to know how long a message has been in flight). Idempotent."""
    queue, message = _guarded()
    messages = queue.__dict__["messages"]
    if not hasattr(messages.fget, "fair_queues"):
        fair = _bind(_fair_messages, messages.fget)
        queue.messages = property(fair)
    mark = message.__dict__["mark_received"]
    if not hasattr(mark, "fair_queues"):
        message.mark_received = _bind(_stamped_receive, mark)


def _bind(function: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    def bound(self: Any, *args: Any, **kwargs: Any) -> Any:
        return function(self, *args, original=original, **kwargs)

    bound.fair_queues = True  # type: ignore[attr-defined]
    bound.__doc__ = function.__doc__
    return bound


def _guarded() -> tuple[Any, Any]:
    """moto's SQS Queue and Message, checked to have the shape the rule patches: a
    receive walks `queue.messages` (a property listing the visible, undelayed messages
    of `queue._messages`) and marks each with `mark_received(visibility_timeout)`."""
    import moto.sqs.models as sqs_models

    def refuse(problem: str) -> Exception:
        return moto_guards.refuse("moto", problem, PATCHER)

    queue = getattr(sqs_models, "Queue", None)
    message = getattr(sqs_models, "Message", None)
    backend = getattr(sqs_models, "SQSBackend", None)
    if not all(isinstance(found, type) for found in (queue, message, backend)):
        raise refuse("moto.sqs.models has no Queue, Message or SQSBackend")
    messages = vars(queue).get("messages")
    if not isinstance(messages, property) or messages.fget is None:
        raise refuse("moto's SQS Queue.messages is no longer a property")
    if not hasattr(messages.fget, "fair_queues"):
        listing = moto_guards.code(messages.fget)
        if "formessageinself._messages" not in listing or "message.visible" not in listing:
            raise refuse("Queue.messages no longer lists self._messages' visible messages")
    mark = vars(message).get("mark_received")
    if mark is None:
        raise refuse("moto's SQS Message.mark_received is gone")
    if not hasattr(mark, "fair_queues") and moto_guards.parameters(mark) != [
        "self",
        "visibility_timeout",
    ]:
        raise refuse("Message.mark_received(self, visibility_timeout) changed")
    receive = moto_guards.code(backend.receive_message)  # type: ignore[union-attr]
    if "formessageinqueue.messages:" not in receive or "message.mark_received(" not in receive:
        raise refuse("SQSBackend.receive_message no longer walks queue.messages")
    for name in ("group_id", "approximate_receive_count"):
        if name not in moto_guards.source_of(message.__init__):  # type: ignore[union-attr,misc]
            raise refuse(f"moto's SQS Message no longer has {name}")
    return queue, message
