"""An agent session's checkpoint in the task dir: written after each completed turn, read to resume.

The SDK mirrors the CLI's transcript into a session store (`TranscriptStore`); after every
turn whose tool calls all have their results, the store rewrites `CHECKPOINT_FILE` (a
header line, then one transcript entry a line) for the worker to upload (the child holds
no AWS credentials). On a retry the worker puts the newest earlier checkpoint at
`RESTORE_FILE`; `read_checkpoint` checks it whole, and `TranscriptStore.load` hands it to
the SDK, which materializes it for the CLI's `--resume`. Anything unreadable raises
`CheckpointError`: the caller starts fresh and says why. A continuation (another task's
final checkpoint at `RESTORE_FILE`) has no fresh start: without it the task fails.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from agentq.checkpoints import MAX_CHECKPOINT_BYTES, Checkpoint, CheckpointError, decode, encode
from agentq.errors import TaskError

if TYPE_CHECKING:  # the worker reads this module too, and never loads the SDK
    from claude_agent_sdk import SessionKey, SessionStoreEntry

CHECKPOINT_FILE: Final = "checkpoint/session.jsonl"
RESTORE_FILE: Final = "checkpoint/restore.jsonl"

# Appended to the system prompt of a resumed run; RESUME_PROMPT is its first new message.
RESUME_NOTE: Final = (
    "This task was interrupted (its worker stopped, or a model call failed) and has been "
    "resumed from its last "
    "checkpoint: the conversation above is what happened before the interruption. A tool "
    "call with side effects that was under way may or may not have taken effect: check "
    "before you repeat it, never repeat it blindly."
)


def completed_turns(entries: Sequence[Mapping[str, Any]]) -> int:
    """Assistant messages whose every tool call has its result: the turns a resume keeps."""
    answered: set[str] = set()
    calls: dict[str, set[str]] = {}
    for entry in entries:
        message = entry.get("message")
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "tool_result":
                answered.add(str(block.get("tool_use_id")))
            elif block.get("type") == "tool_use" and entry.get("type") == "assistant":
                calls.setdefault(str(message.get("id")), set()).add(str(block.get("id")))
    return sum(1 for ids in calls.values() if ids <= answered)


def read_checkpoint(path: Path) -> Checkpoint:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as source:
            data = source.read(MAX_CHECKPOINT_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"unreadable: {exc.strerror}") from None
    return decode(data)


class TranscriptStore:
    """A `claude_agent_sdk` session store (its two required methods) that keeps the main
    session's transcript here.

    Only the main transcript is kept (a subagent's, under a `subpath`, is not resumed).
    A resumed session starts from the restored entries, so each checkpoint holds the
    whole conversation, not only this attempt's part of it.
    """

    def __init__(self, target: Path, restored: Checkpoint | None = None) -> None:
        self._target = target
        self.session_id = restored.session_id if restored else None
        self._entries: list[dict[str, Any]] = list(restored.entries) if restored else []
        self.turns = restored.turns if restored else 0
        self.written_turns = self.turns
        self._written_entries = self._started_entries = len(self._entries)

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        if key.get("subpath"):
            return
        if key.get("session_id") != self.session_id:
            # Another session (an in-attempt retry started afresh): it replaces the old one.
            self.session_id, self._entries = str(key.get("session_id")), []
            self.turns = self.written_turns = self._written_entries = self._started_entries = 0
        self._entries.extend(cast(list[dict[str, Any]], entries))
        self.turns = completed_turns(self._entries)
        if self.turns > self.written_turns:
            self._write()

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        if key.get("subpath") or key.get("session_id") != self.session_id:
            return None
        return cast("list[SessionStoreEntry]", list(self._entries)) or None

    def rewind(self) -> str | None:
        """Back to the last checkpoint written, for an in-attempt retry: the session id it
        resumes, or None when this attempt has written none (the retry starts as the
        attempt did). The failed run's unfinished turn is dropped, as another worker's
        resume would drop it."""
        del self._entries[self._written_entries :]
        self.turns = self.written_turns
        if self.session_id is None or self._written_entries == self._started_entries:
            return None
        return self.session_id

    def flush(self) -> None:
        """Write what the last write left out: at a session's successful end, its final
        answer (no tool call, so no completed turn), which a continuation goes on from."""
        if self.session_id is not None and len(self._entries) > self._written_entries:
            self._write()

    def _write(self) -> None:
        assert self.session_id is not None
        data = encode(Checkpoint(session_id=self.session_id, turns=self.turns,
                                 entries=self._entries))  # fmt: skip
        self._target.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: the worker uploads whole checkpoints only.
        partial = self._target.with_name(self._target.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, self._target)
        self.written_turns = self.turns
        self._written_entries = len(self._entries)


@dataclass(frozen=True, kw_only=True)
class ResumePlan:
    """How this attempt starts its session: the store to mirror into, and what it resumes."""

    store: TranscriptStore
    restored: Checkpoint | None
    record: dict[str, Any] | None  # for the attempt's events: resumed from where, or why not
    # Another task's final session, which this task continues with its follow-up.
    continued: bool = False


def plan_resume(task_dir: Path, offered: Mapping[str, Any] | None) -> ResumePlan:
    """`offered`: what the worker found for this attempt (task.json's `resume`), if anything."""
    target = task_dir / CHECKPOINT_FILE
    if not offered:
        return ResumePlan(store=TranscriptStore(target), restored=None, record=None)
    if offered.get("continued_from"):
        return _plan_continue(task_dir, str(offered["continued_from"]))
    problem = offered.get("unreadable")
    if problem is None:
        try:
            restored = read_checkpoint(task_dir / RESTORE_FILE)
        except CheckpointError as exc:
            problem = f"checkpoint of attempt {offered.get('from_attempt')} is corrupt: {exc}"
        else:
            record = {
                "status": "resumed",
                "from_attempt": offered.get("from_attempt"),
                "turns": restored.turns,
            }
            return ResumePlan(store=TranscriptStore(target, restored), restored=restored,
                              record=record)  # fmt: skip
    return ResumePlan(
        store=TranscriptStore(target),
        restored=None,
        record={"status": "fresh", "reason": str(problem)[:300]},
    )


def _plan_continue(task_dir: Path, source_id: str) -> ResumePlan:
    try:
        restored = read_checkpoint(task_dir / RESTORE_FILE)
    except CheckpointError as exc:
        # Starting afresh would answer the follow-up without the conversation it follows.
        raise TaskError("not_found", f"cannot continue: the checkpoint of task {source_id} "
                        f"is corrupt ({exc})", retryable=False) from None  # fmt: skip
    record = {"status": "continued", "from_task": source_id, "turns": restored.turns}
    return ResumePlan(store=TranscriptStore(task_dir / CHECKPOINT_FILE, restored),
                      restored=restored, record=record, continued=True)  # fmt: skip
