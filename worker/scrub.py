"""The worker's own secrets out of everything it writes.

At start-up the worker remembers the values of its secret-named variables
(`agentq.security.remember_environment`: the Anthropic key, AWS credentials, the ECS
credentials URI, Slack tokens, ...). From then on they are removed from its log stream
(every record, whatever it holds), from each line of child output it copies, from the
events it sends, and from the files it uploads; error records get them removed where
they are made (`agentq.taxonomy.info` → `sanitize_error_message`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from agentq.events import Event
from agentq.security import ScrubbingStream, redact_known, sanitize_error_message
from worker.outbox import EventSink
from worker.supervisor import MAX_LINE_BYTES


def scrub_log_handlers(handlers: Iterable[logging.Handler]) -> None:
    for handler in handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler.stream, ScrubbingStream
        ):
            handler.setStream(ScrubbingStream(handler.stream))


def child_line(line: str) -> str:
    """A line of a task's output, fit for the worker's log: remembered secrets and the
    known credential patterns removed (the task may print its environment)."""
    return sanitize_error_message(line, limit=MAX_LINE_BYTES)


def scrub_event(event: Event) -> Event:
    detail = json.dumps(event.to_detail())
    clean = redact_known(detail)
    if clean == detail:
        return event
    return Event.from_detail(json.loads(clean), event.detail_type)


class ScrubbingSink:
    """An `EventSink` that sends every event with the remembered secrets removed."""

    def __init__(self, sink: EventSink) -> None:
        self._sink = sink

    def publish(
        self,
        event: Event,
        /,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None:
        self._sink.publish(scrub_event(event), then=then, otherwise=otherwise)
