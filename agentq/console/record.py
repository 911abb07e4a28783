"""Every operator action on record before it is done, and its outcome after it.

An action is stored as an `Operator Action` with `phase: "requested"` (a conditional
put keyed by the event's time and id, so a retried put finds itself), then done, then
its outcome (`phase: "done"`, the same `actionId`) is stored and published. What each
failure leaves is in docs/console.md ("Actions").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from agentq.errors import AgentqError
from agentq.events import Event, now_ms
from agentq.publisher import EventPublisher
from agentq.store import EventStore

T = TypeVar("T")
logger = logging.getLogger(__name__)


class ActionLog:
    def __init__(self, store: EventStore, publisher: EventPublisher, *, ttl_days: int) -> None:
        self._store = store
        self._publisher = publisher
        self._ttl_days = ttl_days

    def perform(
        self,
        event: Event,
        act: Callable[[], T],
        outcome: Callable[[T], Mapping[str, Any]],
    ) -> tuple[T, bool]:
        """Record `event` as requested, run `act`, record `outcome(result)`.

        Returns the action's result and whether its outcome reached EventBridge. An
        error of the action is recorded as its outcome, then raised.
        """
        action_id = uuid.uuid4().hex
        requested = replace(event, payload={**event.payload, "phase": "requested",
                                            "actionId": action_id})  # fmt: skip
        # Not caught: if the intent cannot be stored, nothing is done.
        self._store.append(requested, ttl_days=self._ttl_days)
        try:
            result = act()
        except (AgentqError, ClientError, BotoCoreError) as error:
            self._done(requested, action_id, {"outcome": "failed", "error": _code(error)})
            raise
        return result, self._done(requested, action_id, outcome(result))

    def _done(self, requested: Event, action_id: str, detail: Mapping[str, Any]) -> bool:
        done = replace(
            requested,
            event_id=uuid.uuid4().hex,
            # After the request on the timeline even within one millisecond.
            timestamp_ms=max(now_ms(), requested.timestamp_ms + 1),
            payload={**requested.payload, **detail, "phase": "done", "actionId": action_id},
        )
        try:
            self._store.append(done, ttl_days=self._ttl_days)
        except (ClientError, BotoCoreError) as error:
            # The bus may still carry it to save-event; the request is on record anyway.
            logger.warning("operator action outcome not stored", extra={"error": _code(error)})
        try:
            self._publisher.publish(done)
        except (AgentqError, ClientError, BotoCoreError) as error:
            logger.warning("operator action not published", extra={"error": _code(error)})
            return False
        return True


def _code(error: Exception) -> str:
    # AWS's error code or the exception's name: never the message, which can quote the
    # request (keys, bodies) into an event that operators and consumers read.
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code") or "ClientError")
    return type(error).__name__
