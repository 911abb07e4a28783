"""An agent task's conversation, read from its session checkpoints: turns, attempts, resumes.

Pure (no I/O). `parse_transcript` reads one checkpoint (agentq's header line, then the
CLI's transcript, one JSON entry a line) and skips, counting, what is not an entry.
`build_conversation` joins the checkpoints of a task's attempts in order: each attempt's
checkpoint holds the whole session so far, so an entry already shown for an earlier
attempt is not shown again, and every turn says which attempt added it. A turn is the
task's prompt, a resume (the worker's `RESUME_PROMPT`), a continuation's follow-up, an
assistant message (text, tool calls with their input) or tool results with their output.
Every text is scrubbed of secrets and control characters and capped; the turns shown
are capped too, and the model says what was cut.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, Literal

from agentq.security import sanitize_error_message

# Sent as the first new message of a resumed run (the worker's agent kind sends it).
RESUME_PROMPT: Final = (
    "The task was interrupted and has been resumed. Continue from where the conversation "
    "stopped; do not start over."
)
# What one block shows, and how many turns a view gets: the head (the prompt and how
# the work began) and the tail (where it stands), with the middle counted, not shown.
MAX_BLOCK_CHARS: Final = 2_000
MAX_TURNS: Final = 200
HEAD_TURNS: Final = 20
_SCRUB_MARGIN: Final = 100
# The CLI writes this model name on messages it made up itself ("No response requested.").
_SYNTHETIC: Final = "<synthetic>"

TurnKind = Literal["prompt", "resume", "follow_up", "assistant", "tool_results", "user"]
BlockKind = Literal["text", "tool_call", "tool_result"]


@dataclass(frozen=True, kw_only=True)
class Block:
    kind: BlockKind
    text: str
    tool: str | None = None  # the tool called, or whose result this is
    is_error: bool = False
    cut_chars: int = 0  # characters of the text not shown


@dataclass(frozen=True, kw_only=True)
class Turn:
    index: int  # its place in the whole conversation (0-based), gaps included
    attempt: int
    role: Literal["user", "assistant"]
    kind: TurnKind
    blocks: tuple[Block, ...]
    timestamp: str | None = None


@dataclass(frozen=True, kw_only=True)
class AttemptPart:
    """What one attempt's checkpoint added, or why it added nothing."""

    attempt: int
    turns: int  # turns this attempt added (shown or not)
    resumed: bool  # it went on from an earlier attempt's checkpoint
    fresh_session: bool  # it started a session of its own (not the first attempt's)
    skipped_lines: int = 0
    problem: str | None = None  # no checkpoint, unreadable, ...


@dataclass(frozen=True, kw_only=True)
class Transcript:
    entries: list[dict[str, Any]]
    skipped_lines: int


@dataclass(kw_only=True)
class Conversation:
    turns: list[Turn] = field(default_factory=list)
    attempts: list[AttemptPart] = field(default_factory=list)
    total_turns: int = 0
    omitted_turns: int = 0  # turns not shown, after the first HEAD_TURNS
    skipped_lines: int = 0
    continues: str | None = None  # the task whose session this one went on from
    note: str | None = None  # why there is nothing to show

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class AttemptCheckpoint:
    """One attempt's checkpoint as read: bytes, or None with why (`problem`)."""

    attempt: int
    data: bytes | None
    problem: str | None = None


def parse_transcript(data: bytes) -> Transcript:
    """The JSON object lines of a checkpoint; any other line is skipped and counted
    (agentq's own header line is skipped silently)."""
    entries: list[dict[str, Any]] = []
    skipped = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            skipped += 1
            continue
        if not isinstance(entry, dict):
            skipped += 1
        elif "agentq_checkpoint" not in entry:
            entries.append(entry)
    return Transcript(entries=entries, skipped_lines=skipped)


def clean(text: str) -> str:
    """Scrubbed of secrets and control characters (newlines and tabs kept)."""
    return sanitize_error_message(text, limit=MAX_BLOCK_CHARS * 4)


def _block(kind: BlockKind, text: str, **extra: Any) -> Block:
    """A block of raw text, cut to what may be shown plus a margin (so a secret that
    straddles the cut is still whole for the scrubber); `_scrubbed` finishes it."""
    return Block(kind=kind, text=text[: MAX_BLOCK_CHARS + _SCRUB_MARGIN],
                 cut_chars=max(0, len(text) - MAX_BLOCK_CHARS), **extra)  # fmt: skip


def _scrubbed(turn: Turn) -> Turn:
    """Only shown turns are scrubbed: the scrubber costs ~8 µs a character on long
    alphanumeric runs (base64 output), so the turns not shown are never paid for."""
    blocks = []
    for block in turn.blocks:
        shown = clean(block.text)
        cut = block.cut_chars
        if len(shown) > MAX_BLOCK_CHARS:  # the margin, or a redaction that lengthened it
            cut = max(cut, len(shown) - MAX_BLOCK_CHARS)
            shown = shown[:MAX_BLOCK_CHARS]
        blocks.append(replace(block, text=shown, cut_chars=cut))
    return replace(turn, blocks=tuple(blocks))


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [
            str(item.get("text", "")) if isinstance(item, Mapping) and item.get("type") == "text"
            else f"[{item.get('type')}]" if isinstance(item, Mapping) else _as_text(item)
            for item in value
        ]  # fmt: skip
        return "\n".join(parts)
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return repr(value)[: MAX_BLOCK_CHARS * 2]


def _identity(entry: Mapping[str, Any]) -> str:
    uuid = entry.get("uuid")
    if isinstance(uuid, str) and uuid:
        return uuid
    try:
        return json.dumps(entry, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(entry)


@dataclass
class _Reader:
    """Turns of entries, in order; remembers tool names and sessions across attempts."""

    tool_names: dict[str, str] = field(default_factory=dict)
    prompted_sessions: set[str] = field(default_factory=set)

    def turn(self, entry: Mapping[str, Any]) -> tuple[str, TurnKind, list[Block]] | None:
        if entry.get("isSidechain") is True:
            return None
        message = entry.get("message")
        if not isinstance(message, Mapping):
            return None
        kind = entry.get("type")
        if kind == "assistant" and message.get("model") != _SYNTHETIC:
            return "assistant", "assistant", self._assistant(message.get("content"))
        if kind == "user":
            return self._user(message.get("content"), entry.get("sessionId"))
        return None

    def _assistant(self, content: Any) -> list[Block]:
        if isinstance(content, str):
            return [_block("text", content)]
        blocks = []
        for item in content if isinstance(content, list) else []:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "text":
                blocks.append(_block("text", _as_text(item.get("text"))))
            elif item.get("type") == "tool_use":
                name = clean(str(item.get("name", "?"))[:200])
                self.tool_names[str(item.get("id"))] = name
                blocks.append(_block("tool_call", _as_text(item.get("input")), tool=name))
        return blocks

    def _user(self, content: Any, session: Any) -> tuple[str, TurnKind, list[Block]] | None:
        if isinstance(content, str):
            return "user", self._prompt_kind(content, session), [_block("text", content)]
        if not isinstance(content, list):
            return None
        blocks: list[Block] = []
        results = False
        for item in content:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "tool_result":
                results = True
                tool = self.tool_names.get(str(item.get("tool_use_id")))
                blocks.append(_block("tool_result", _as_text(item.get("content")), tool=tool,
                                     is_error=item.get("is_error") is True))  # fmt: skip
            elif item.get("type") == "text":
                blocks.append(_block("text", _as_text(item.get("text"))))
        if results:
            return "user", "tool_results", blocks
        text = "\n".join(b.text for b in blocks)
        return ("user", self._prompt_kind(text, session), blocks) if blocks else None

    def _prompt_kind(self, text: str, session: Any) -> TurnKind:
        if text.strip() == RESUME_PROMPT:
            return "resume"
        key = str(session)
        if key not in self.prompted_sessions:
            self.prompted_sessions.add(key)
            return "prompt"
        return "follow_up"


def build_conversation(
    checkpoints: Iterable[AttemptCheckpoint],
    *,
    continues: str | None = None,
    max_turns: int = MAX_TURNS,
    head_turns: int = HEAD_TURNS,
) -> Conversation:
    """The conversation across attempts (in attempt order), each entry shown once."""
    conversation = Conversation(continues=continues)
    reader = _Reader()
    seen: set[str] = set()
    sessions: list[str] = []
    turns: list[Turn] = []
    for checkpoint in sorted(checkpoints, key=lambda c: c.attempt):
        if checkpoint.data is None:
            conversation.attempts.append(AttemptPart(
                attempt=checkpoint.attempt, turns=0, resumed=False, fresh_session=False,
                problem=checkpoint.problem or "no checkpoint",
            ))  # fmt: skip
            continue
        transcript = parse_transcript(checkpoint.data)
        conversation.skipped_lines += transcript.skipped_lines
        shared = False
        added: list[Turn] = []
        fresh = False
        # Only an entry an earlier attempt showed makes this one a resume: a transcript
        # may hold the same entry twice (a line written again), which is shown once.
        earlier = frozenset(seen)
        for entry in transcript.entries:
            identity = _identity(entry)
            if identity in seen:
                shared = shared or identity in earlier
                continue
            seen.add(identity)
            session = entry.get("sessionId")
            if isinstance(session, str) and session not in sessions:
                fresh = fresh or bool(sessions)
                sessions.append(session)
            made = reader.turn(entry)
            if made is None:
                continue
            role, kind, blocks = made
            stamp = entry.get("timestamp")
            added.append(Turn(
                index=len(turns) + len(added), attempt=checkpoint.attempt,
                role=role,  # type: ignore[arg-type]
                kind=kind, blocks=tuple(blocks),
                timestamp=stamp[:40] if isinstance(stamp, str) else None,
            ))  # fmt: skip
        turns.extend(added)
        resumed = shared or any(t.kind == "resume" for t in added)
        conversation.attempts.append(AttemptPart(
            attempt=checkpoint.attempt, turns=len(added), resumed=resumed and not fresh,
            fresh_session=fresh, skipped_lines=transcript.skipped_lines,
            problem=checkpoint.problem,
        ))  # fmt: skip
    conversation.total_turns = len(turns)
    shown = _bounded(turns, max(1, max_turns), max(0, min(head_turns, max_turns)))
    conversation.turns = [_scrubbed(turn) for turn in shown]
    conversation.omitted_turns = len(turns) - len(conversation.turns)
    return conversation


def _bounded(turns: Sequence[Turn], most: int, head: int) -> list[Turn]:
    if len(turns) <= most:
        return list(turns)
    return [*turns[:head], *turns[len(turns) - (most - head) :]]
