"""What a task's attempt left in S3 besides its result: logs, the agent's trace, its
conversation.

`TaskOutputs.location` is the one place that turns a STATE item into the S3 prefix
of its objects, from the pointers the item holds (the attempt folder the worker's
final write named, else the result's), so the result, logs and trace are always read
from the same attempt; no key is guessed. The conversation is every attempt's session
checkpoint (agentq/checkpoints.py: each attempt writes only its own), in attempt order.
"""

from __future__ import annotations

from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.checkpoints import CheckpointError, read_attempt
from agentq.conversation import AttemptCheckpoint, Conversation, build_conversation
from agentq.errors import NoOutputYet, NotFound
from agentq.jobs import ResultReader
from agentq.jobs.results import RESULT_FILE, artifacts_pointer
from agentq.json_text import decode_lenient
from agentq.resume import override_of
from agentq.store import TaskRecord
from agentq.store.keys import attempt_prefix

TRACE_FILE: Final = "traces/session_trace.json"
ERROR_FILE: Final = "error.json"
# The worker bounds what it uploads; this cap keeps one odd object off a terminal.
MAX_OUTPUT_BYTES: Final = 4 * 1024 * 1024
# A view reads at most this much of one attempt's checkpoint, of this many attempts
# (the latest): a longer transcript shows its beginning, and says it was cut.
MAX_CONVERSATION_BYTES: Final = 16 * 1024 * 1024
MAX_CONVERSATION_ATTEMPTS: Final = 10


class TaskOutputs:
    def __init__(self, s3: Any, results: ResultReader) -> None:
        self._s3 = s3
        self._results = results

    def location(self, record: TaskRecord) -> tuple[str, str]:
        """(bucket, key prefix) of the objects the task's attempt uploaded: the attempt
        folder the item names, else its result's; for a live task without either, the
        folder of the attempt it holds now (`NoOutputYet` before its first attempt)."""
        named = artifacts_pointer(record)
        if named is not None:
            return named
        try:
            bucket, key = self._results.pointer(record)
        except NotFound:
            if record.state.terminal or record.attempt < 1:
                raise NoOutputYet(record.request_id, record.state.value, "output",
                                  final=record.state.terminal) from None  # fmt: skip
            return self._results.bucket, attempt_prefix(
                record.tenant, record.request_id, record.attempt
            )
        return bucket, key.removesuffix(RESULT_FILE)

    def logs(self, record: TaskRecord) -> dict[str, str]:
        bucket, prefix = self.location(record)
        keys = self._keys(bucket, prefix + "logs/")
        keys += [k for k in self._keys(bucket, prefix + ERROR_FILE) if k == prefix + ERROR_FILE]
        if not keys:
            if not record.state.terminal:
                raise NoOutputYet(record.request_id, record.state.value, "logs")
            raise NotFound("task logs", f"s3://{bucket}/{prefix}logs/")
        return {key.removeprefix(prefix): self._read_text(bucket, key) for key in keys}

    def trace(self, record: TaskRecord) -> Any:
        bucket, prefix = self.location(record)
        key = prefix + TRACE_FILE
        if key not in self._keys(bucket, key):
            if not record.state.terminal:
                raise NoOutputYet(record.request_id, record.state.value, "agent trace")
            raise NotFound("agent trace", f"s3://{bucket}/{key}")
        return readable_trace(
            decode_lenient(self._read_text(bucket, key), name=f"s3://{bucket}/{key}", what="trace")
        )

    def _keys(self, bucket: str, prefix: str) -> list[str]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def _read_text(self, bucket: str, key: str) -> str:
        data: bytes = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_OUTPUT_BYTES)
        return data.decode("utf-8", errors="replace")

    def conversation(
        self, record: TaskRecord, *, transcripts: bool | None, resume_on: bool | None
    ) -> Conversation:
        """The task's conversation across its attempts, or one that says why there is none.

        `transcripts`: its tenant's setting (False: nothing is read; None: unknown to this
        reader, who then relies on the mark a worker leaves on the STATE item);
        `resume_on`: whether it resumes, its own `resume` else its definition's (None:
        unknown)."""
        continues = (record.envelope or {}).get("continues")
        continues = continues if isinstance(continues, str) else None
        if transcripts is False or record.raw.get("transcripts") == "off":
            return Conversation(continues=continues, note=(
                f"no conversation stored (tenant {record.tenant} does not store transcripts)"
            ))  # fmt: skip
        if resume_on is False and continues is None:
            which = "task" if override_of(record.envelope) is False else "definition"
            return Conversation(continues=continues, note=(
                f"no conversation stored (resume off for this {which})"
            ))  # fmt: skip
        first = max(1, record.attempt - MAX_CONVERSATION_ATTEMPTS + 1)
        parts = [self._checkpoint(record, n) for n in range(first, record.attempt + 1)]
        conversation = build_conversation(parts, continues=continues)
        if not any(part.data for part in parts):
            problems = {part.problem for part in parts} - {"no checkpoint"}
            conversation.note = (
                f"no checkpoint readable ({'; '.join(sorted(p for p in problems if p))})"
                if problems
                else "no checkpoint yet"
                if not record.state.terminal
                else "no conversation stored (no attempt left a checkpoint)"
            )
        return conversation

    def _checkpoint(self, record: TaskRecord, attempt: int) -> AttemptCheckpoint:
        try:
            stored = read_attempt(self._s3, self._results.bucket, record.tenant,
                                  record.request_id, attempt, limit=MAX_CONVERSATION_BYTES)  # fmt: skip
        except CheckpointError as exc:
            return AttemptCheckpoint(attempt=attempt, data=None, problem=f"corrupt ({exc})")
        except (ClientError, BotoCoreError) as exc:
            return AttemptCheckpoint(attempt=attempt, data=None,
                                     problem=f"unreadable ({type(exc).__name__})")  # fmt: skip
        if stored is None:
            return AttemptCheckpoint(attempt=attempt, data=None, problem="no checkpoint")
        of = f" of {stored.size}" if stored.size else ""
        cut = None if stored.whole else f"only its first {len(stored.data)}{of} bytes read"
        return AttemptCheckpoint(attempt=attempt, data=stored.data, problem=cut)


def readable_trace(trace: Any) -> Any:
    """An agent trace as every view reads it (`agentq trace`, its JSON, the console):
    each turn's output count left out (None). The CLI reports a turn's usage as the model
    starts answering (output 1, whatever it then writes); the trace's totals, from the
    attempt's result, carry the real count, the one place tokens are read from."""
    if not isinstance(trace, dict) or not isinstance(trace.get("turns"), list):
        return trace
    turns = [
        {**turn, "usage": {**turn["usage"], "output_tokens": None}}
        if isinstance(turn, dict) and isinstance(turn.get("usage"), dict)
        else turn
        for turn in trace["turns"]
    ]
    return {**trace, "turns": turns}
