"""Continuing a finished agent task: whether a task can be continued, and from which checkpoint.

A task continues another of its own tenant (`TaskEnvelope.continues`). The source's STATE
item is read under the continuing task's tenant (the key holds the tenant, so another
tenant's task is simply not found); it must be COMPLETED and name the session checkpoint
of its winning attempt (`checkpoint`, written by the same lease-fenced write as the result
pointer, so a stale holder's checkpoint is never named). Producers check this at submit
(`check_continuable`); the worker reads the same pointer when the continuation starts.
A tenant whose transcripts are off (`agentq tenants transcripts T off`) has no session
to continue, nor may its tasks continue one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from agentq.definitions import TaskDefinition
from agentq.errors import InvalidInput
from agentq.states import TaskState
from agentq.store import TaskRecord
from agentq.store.keys import CHECKPOINT_NAME, attempt_prefix

FIELD: Final = "continues"


class ContinueRefused(InvalidInput):
    """The named task cannot be continued; the message says why."""

    def __init__(self, problem: str) -> None:
        super().__init__(FIELD, problem)


def transcripts_off_reason(tenant: str) -> str:
    return (
        f"tenant {tenant} does not store transcripts (agentq tenants transcripts): its "
        "agent tasks keep no session, so none is resumed or continued"
    )


def source_checkpoint(record: TaskRecord | None, source_id: str) -> tuple[str, str]:
    """(bucket, key) of the final session checkpoint of the task `record` is (None: not
    found for this tenant); `ContinueRefused` saying why when there is none to start from."""
    if record is None:
        raise ContinueRefused(
            f"task {source_id} was not found (a task can only continue its own tenant's tasks)"
        )
    if record.raw.get("transcripts") == "off":
        raise ContinueRefused(transcripts_off_reason(record.tenant))
    if record.state is not TaskState.COMPLETED:
        raise ContinueRefused(
            f"task {source_id} is {record.state.value}: only a COMPLETED task can be continued"
        )
    stored = record.raw.get("checkpoint")
    if not isinstance(stored, Mapping) or not isinstance(stored.get("key"), str):
        raise ContinueRefused(
            f"task {source_id} left no session checkpoint to continue from: only an agent "
            "task with resume on (its definition's resume: true, or its own) keeps its session"
        )
    key, bucket = str(stored["key"]), stored.get("bucket")
    winner = _winning_prefix(record)
    if not isinstance(bucket, str) or winner is None or key != winner + CHECKPOINT_NAME:
        raise ContinueRefused(
            f"task {source_id} names a checkpoint outside its winning attempt's objects"
        )
    return bucket, key


def _winning_prefix(record: TaskRecord) -> str | None:
    """The folder of the attempt the STATE item's result pointer names."""
    result = record.raw.get("result")
    key = result.get("key") if isinstance(result, Mapping) else None
    if not isinstance(key, str):
        return None
    for attempt in range(record.attempt, 0, -1):
        prefix = attempt_prefix(record.tenant, record.request_id, attempt)
        if key.startswith(prefix):
            return prefix
    return None


def check_continuable(
    record: TaskRecord | None,
    source_id: str,
    *,
    definition: TaskDefinition | None,
    transcripts: bool | None = None,
) -> None:
    """Refuse at submit what the worker would refuse: a source without a final checkpoint,
    a tenant whose transcripts are off (`transcripts` False; None: not known here), or a
    continuation whose own definition is not an agent's (when known)."""
    if transcripts is False and record is not None:
        raise ContinueRefused(transcripts_off_reason(record.tenant))
    source_checkpoint(record, source_id)
    if definition is not None and definition.kind != "agent":
        raise InvalidInput(
            "definition",
            f"{definition.name!r} is a {definition.kind} definition: only an agent task can "
            "continue another",
        )
