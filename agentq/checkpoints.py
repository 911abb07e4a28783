"""An agent session's checkpoint: its format, and how an attempt keeps it in S3 in parts.

A checkpoint is a header line, then the CLI's transcript, one entry a line. A running
attempt uploads it in numbered parts (`part_key`): a part holds the entries added since the
last stored part, after a line saying where they start, so a turn costs one PUT of what
changed. Every SNAPSHOT_EVERY-th part, and the first of a new session, holds the whole
transcript, so a reader needs a HEAD per snapshot and at most SNAPSHOT_EVERY GETs. At
the attempt's end the whole checkpoint is also put at `checkpoint_key` (one GET for a
continuation and the views), naming the last part it covers: an attempt run again (an
operator's retry or a redrive restarts the count) numbers its parts from the next
snapshot, and those win over it.
`read_attempt` reads either back, joined and checked.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from agentq.errors import shown
from agentq.store.keys import CHECKPOINT_NAME, attempt_prefix, checkpoint_key

FORMAT: Final = 1
# Transcripts of long sessions reach a few MiB; past this a checkpoint is not trusted.
MAX_CHECKPOINT_BYTES: Final = 64 * 1024 * 1024
SNAPSHOT_EVERY: Final = 32
PART_FOLDER: Final = CHECKPOINT_NAME.rsplit("/", 1)[0] + "/"
# Without s3:ListBucket, S3 answers a missing key with 403 (agentq/local/rules/s3_missing_key.py).
MISSING: Final = frozenset({"NoSuchKey", "NotFound", "404", "AccessDenied", "403"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: the task starts its session afresh."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    session_id: str
    turns: int
    entries: list[dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Part:
    """Entry lines `first_entry` on of a session's transcript, as of `turns` turns."""

    session_id: str
    turns: int
    first_entry: int
    lines: list[bytes]


def part_key(tenant: str, request_id: str, attempt: int, number: int) -> str:
    return f"{attempt_prefix(tenant, request_id, attempt)}{PART_FOLDER}part-{number:06d}.jsonl"


def is_snapshot(number: int) -> bool:
    """Whether part `number` must hold the whole transcript (a reader starts at one)."""
    return (number - 1) % SNAPSHOT_EVERY == 0


def is_checkpoint_key(key: str) -> bool:
    """Any object of an attempt's checkpoint: the whole one, or a part."""
    return key.endswith("/" + CHECKPOINT_NAME) or f"/{PART_FOLDER}part-" in key


def encode(checkpoint: Checkpoint) -> bytes:
    lines = [json.dumps(e, ensure_ascii=False).encode() for e in checkpoint.entries]
    return _whole(checkpoint.session_id, checkpoint.turns, lines)


def decode(data: bytes) -> Checkpoint:
    """The checkpoint in `data`, checked whole (a cut or altered file is refused)."""
    whole = split(data)
    try:
        rows = [json.loads(line) for line in whole.lines]
    except ValueError as exc:
        raise CheckpointError(f"not JSON lines: {type(exc).__name__}") from None
    if not all(isinstance(r, dict) for r in rows):
        raise CheckpointError("an entry that is not an object")
    return Checkpoint(session_id=whole.session_id, turns=whole.turns, entries=rows)


def split(data: bytes) -> Part:
    """A whole checkpoint as the part from entry 0 it is, its entry lines unparsed: what
    an uploader needs to send only the lines that are new."""
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"larger than {MAX_CHECKPOINT_BYTES} bytes")
    head, _, rest = data.partition(b"\n")
    header = _header(head, "agentq_checkpoint")
    lines = rest.splitlines()
    if header.get("entries") != len(lines):
        raise CheckpointError(f"{len(lines)} entries where the header says "
                              f"{shown(header.get('entries'))}")  # fmt: skip
    return Part(session_id=header["session_id"], turns=header["turns"], first_entry=0,
                lines=lines)  # fmt: skip


def encode_part(part: Part) -> bytes:
    header = {
        "agentq_checkpoint_part": FORMAT,
        "session_id": part.session_id,
        "turns": part.turns,
        "first_entry": part.first_entry,
        "entries": len(part.lines),
    }
    return b"\n".join([json.dumps(header).encode(), *part.lines]) + b"\n"


def decode_part(data: bytes) -> Part:
    head, _, rest = data.partition(b"\n")
    header = _header(head, "agentq_checkpoint_part")
    lines = rest.splitlines()
    first = header.get("first_entry")
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise CheckpointError("a part without the entry it starts at")
    if header.get("entries") != len(lines):
        raise CheckpointError(f"a part of {len(lines)} entries where its header says "
                              f"{shown(header.get('entries'))}")  # fmt: skip
    return Part(session_id=header["session_id"], turns=header["turns"], first_entry=first,
                lines=lines)  # fmt: skip


def join_parts(parts: Iterable[Part]) -> bytes:
    """The whole checkpoint the parts make, in order; a part that starts a session (entry
    0) replaces what came before it. A gap or a session changing mid-way is refused."""
    session, turns, lines = "", 0, list[bytes]()
    for part in parts:
        if part.first_entry == 0:
            session, lines = part.session_id, []
        elif part.session_id != session or part.first_entry != len(lines):
            raise CheckpointError(f"a part starting at entry {part.first_entry} follows "
                                  f"{len(lines)} entries of {session or 'no session'}")  # fmt: skip
        lines.extend(part.lines)
        turns = part.turns
    if not session:
        raise CheckpointError("no part starts the session")
    return _whole(session, turns, lines)


def encode_whole(part: Part, *, parts: int) -> bytes:
    """The whole checkpoint of `part` (from entry 0), naming `parts`: the number of the
    last part its attempt had stored, after which a newer part would supersede it."""
    return _whole(part.session_id, part.turns, part.lines, parts=parts)


def next_snapshot(after: int) -> int:
    """The first snapshot number past part `after`: where a new run of the attempt (after
    an operator's retry or a redrive) starts its own parts."""
    return 1 + SNAPSHOT_EVERY * -(-after // SNAPSHOT_EVERY)


def _whole(session_id: str, turns: int, lines: list[bytes], parts: int | None = None) -> bytes:
    header: dict[str, Any] = {"agentq_checkpoint": FORMAT, "session_id": session_id,
                              "turns": turns, "entries": len(lines)}  # fmt: skip
    if parts is not None:
        header["parts"] = parts
    return b"\n".join([json.dumps(header).encode(), *lines]) + b"\n"


def _parts_covered(data: bytes) -> int | None:
    """The `parts` a whole checkpoint's header names (None: an older one, or unreadable)."""
    try:
        parts = json.loads(data.partition(b"\n")[0]).get("parts")
    except (ValueError, AttributeError):
        return None
    return parts if isinstance(parts, int) and not isinstance(parts, bool) and parts >= 0 \
        else None  # fmt: skip


def _header(line: bytes, marker: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise CheckpointError(f"not JSON lines: {type(exc).__name__}") from None
    if not isinstance(header, dict) or header.get(marker) != FORMAT:
        raise CheckpointError("no checkpoint header")
    turns = header.get("turns")
    if not _is_uuid(header.get("session_id")) or not isinstance(turns, int) or \
            isinstance(turns, bool):  # fmt: skip
        raise CheckpointError("a header without a session id or turn count")
    return header


def _is_uuid(value: object) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


# -- reading from S3 ---------------------------------------------------------------------
@dataclass(frozen=True)
class Stored:
    """An attempt's checkpoint as read: `data`, cut at the reader's limit when `whole` is
    False (the worker refuses such a one; a view shows its beginning). `size`: the whole
    one's, where S3 said it."""

    data: bytes
    whole: bool
    size: int | None = None
    parts: int | None = None  # the number of the last part it holds or covers


def fetch(s3: Any, bucket: str, key: str, *, limit: int) -> Stored | None:
    """One object, read up to `limit` bytes; None when there is none (404, or 403 for a
    reader without ListBucket). Raises what S3 and botocore raise after their retries."""
    from botocore.exceptions import ClientError  # the child imports this module too

    try:
        found = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in MISSING:
            return None
        raise
    data: bytes = found["Body"].read(limit)
    size = found.get("ContentLength", len(data))
    return Stored(data, whole=size <= limit, size=size)


def read_attempt(
    s3: Any, bucket: str, tenant: str, request_id: str, attempt: int, *,
    limit: int = MAX_CHECKPOINT_BYTES,
) -> Stored | None:  # fmt: skip
    """The attempt's checkpoint: its whole object, else joined from its parts; None when
    it left none. Raises `CheckpointError` for parts that do not join, and S3's errors.

    A whole one names the parts it covers; parts past them (a new run of the attempt after
    an operator's retry, killed before it put its own whole) are newer and win: one HEAD
    tells."""
    whole = fetch(s3, bucket, checkpoint_key(tenant, request_id, attempt), limit=limit)
    covered = None if whole is None else _parts_covered(whole.data)
    if whole is not None and covered is None:
        return whole
    first = 1 if covered is None else next_snapshot(covered)
    start = _last_snapshot(s3, bucket, tenant, request_id, attempt, first=first)
    if start is None:
        return None if whole is None else dataclasses.replace(whole, parts=covered)
    parts, size, number = [], 0, start
    while (found := fetch(s3, bucket, part_key(tenant, request_id, attempt, number),
                          limit=MAX_CHECKPOINT_BYTES)) is not None:  # fmt: skip
        if not found.whole:
            raise CheckpointError(f"part {number} is larger than {MAX_CHECKPOINT_BYTES} bytes")
        part = decode_part(found.data)
        size = (0 if part.first_entry == 0 else size) + len(found.data)
        parts.append(part)
        if size > limit:
            return Stored(join_parts(parts)[:limit], whole=False, parts=number)
        number += 1
    return Stored(join_parts(parts), whole=True, parts=number - 1)


def _last_snapshot(
    s3: Any, bucket: str, tenant: str, request_id: str, attempt: int, *, first: int = 1
) -> int | None:
    """The number of the newest snapshot part from `first` on, found by HEADs (None:
    no part there)."""
    from botocore.exceptions import ClientError

    last, number = None, first
    while True:
        try:
            s3.head_object(Bucket=bucket, Key=part_key(tenant, request_id, attempt, number))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING:
                return last
            raise
        last, number = number, number + SNAPSHOT_EVERY
