"""The worker's own secrets out of everything it writes.

At start-up the worker remembers the values of its secret-named variables
(`agentq.security.remember_environment`: the Anthropic key, AWS credentials, the ECS
credentials URI, Slack tokens, ...). From then on they are removed from its log stream
(every record, whatever it holds), from each line of child output it copies, from the
events it sends, and from the files it uploads; error records get them removed where
they are made (`agentq.taxonomy.info` → `sanitize_error_message`).

A file is scrubbed as a stream (`scrub_file`), so an output of any size costs a chunk
of memory, not its size; the result is byte for byte what `redact_known_bytes` makes
of the whole file (tests/security/test_scrub_streaming.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Final

from agentq.events import Event
from agentq.security import (
    REDACTED,
    ScrubbingStream,
    known_secret_bytes,
    redact_known,
    sanitize_error_message,
)
from worker.child.supervisor import MAX_LINE_BYTES
from worker.settle.outbox import EventSink

CHUNK_BYTES: Final = 1024 * 1024
_REDACTED_BYTES: Final = REDACTED.encode()


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


def scrub_file(source: IO[bytes], target: IO[bytes], *, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Copy `source` to `target` with the remembered secrets removed, a chunk at a time."""
    chunks = iter(lambda: source.read(chunk_bytes), b"")
    for piece in scrub_chunks(chunks, known_secret_bytes()):
        target.write(piece)


def scrub_chunks(chunks: Iterable[bytes], secrets: Sequence[bytes]) -> Iterator[bytes]:
    """The chunks with each secret replaced, in turn, as `redact_known_bytes` does it to
    the whole: one streaming pass per secret, each fed by the one before."""
    stream: Iterator[bytes] = iter(chunks)
    for secret in secrets:
        if secret:
            stream = _replaced(stream, secret, _REDACTED_BYTES)
    return stream


def _replaced(chunks: Iterator[bytes], old: bytes, new: bytes) -> Iterator[bytes]:
    """`b"".join(chunks).replace(old, new)`, chunk by chunk.

    An occurrence may cross a chunk boundary, so the last `len(old) - 1` bytes, which
    could begin one, wait for the next chunk. The output is cut only where a scan of the
    whole would stand too (right after an occurrence, or before the first position that
    lacks the bytes to decide), so the leftmost, non-overlapping occurrences found are
    the same ones `bytes.replace` finds.
    """
    overlap = len(old) - 1
    pending = b""
    for chunk in chunks:
        data = pending + chunk
        decided = len(data) - overlap  # an occurrence starting before this is whole
        out: list[bytes] = []
        start = 0
        while (found := data.find(old, start)) != -1 and found < decided:
            out += (data[start:found], new)
            start = found + len(old)
        cut = max(start, decided)
        out.append(data[start:cut])
        pending = data[cut:]
        if piece := b"".join(out):
            yield piece
    if pending:
        yield pending.replace(old, new)
