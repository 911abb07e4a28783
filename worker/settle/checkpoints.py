"""Agent session checkpoints in S3, moved by the worker on its child's behalf.

Everything lies under the attempt's own prefix (agentq/checkpoints.py has the layout), so a
holder writes only its own attempt's checkpoint and a stale one never replaces the
winner's. While a resumable task runs, `CheckpointUploader` sends what the child's
checkpoint file gained, at most once per AGENT_CHECKPOINT_INTERVAL, scrubbed like every
upload. `restore` puts the newest checkpoint at or below this attempt into the new task
dir (a missing one is no resume; an unreadable one a fresh start the child records).
`restore_source` puts there the final checkpoint of the task a continuation continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from agentq.checkpoints import (
    MAX_CHECKPOINT_BYTES,
    CheckpointError,
    Part,
    encode_part,
    encode_whole,
    fetch,
    is_snapshot,
    part_key,
    read_attempt,
    split,
)
from agentq.continuation import ContinueRefused, source_checkpoint
from agentq.resume import resumes
from agentq.store import Lease, TaskRecord
from agentq.store.keys import checkpoint_key
from worker.child.files import open_plain
from worker.kinds.agent.checkpoint import CHECKPOINT_FILE, RESTORE_FILE
from worker.settle.scrub import scrub_file

__all__ = ["CheckpointUploader", "checkpoint_key", "restore", "restore_source", "resumable"]

logger = logging.getLogger(__name__)


def resumable(kind: str, settings: Mapping[str, Any], override: bool | None = None) -> bool:
    """An agent task that resumes: the task's own `resume` (`override`) when set, else its
    definition's opt-in (agentq.resume; the child checks the spec whole)."""
    return resumes(kind, settings, override)


def restore(
    s3: Any, bucket: str, *, tenant: str, request_id: str, attempt: int, task_dir: Path
) -> dict[str, Any] | None:
    """Fetch the newest checkpoint at or below `attempt` into the task dir.

    Returns what the child is told (task.json's `resume`): `{"from_attempt": n, "parts":
    p}` with the file in place (`parts`: the last part number it holds or covers, where a
    new run of the same attempt number goes on numbering), `{"unreadable": why}`, or None when no
    attempt left one.
    """
    for earlier in range(attempt, 0, -1):
        try:
            stored = read_attempt(s3, bucket, tenant, request_id, earlier)
        except CheckpointError as exc:
            return {"unreadable": f"checkpoint of attempt {earlier} is corrupt: {exc}"}
        except (ClientError, BotoCoreError, OSError) as exc:
            # botocore already retried a throttle or a dropped connection.
            return _unreadable(request_id, earlier, exc)
        if stored is None:
            continue
        if not stored.whole:
            return {"unreadable": f"checkpoint of attempt {earlier} is too large"}
        _place(task_dir, stored.data)
        return {"from_attempt": earlier, "parts": stored.parts or 0}
    return None


def restore_source(
    s3: Any, bucket: str, *, source: TaskRecord | None, source_id: str, task_dir: Path
) -> dict[str, Any]:
    """Fetch the final checkpoint of the task a continuation continues into the task dir.

    `source` is its STATE item, read under the continuation's tenant. Returns what the
    child is told: `{"continued_from": id}` with the file in place, `{"refused": why}`
    (no checkpoint to start from: the task fails, not retried) or `{"unreadable": why}`
    (S3 failed: the attempt is retried).
    """
    try:
        stored_bucket, key = source_checkpoint(source, source_id)
    except ContinueRefused as exc:
        return {"refused": exc.problem}
    if stored_bucket != bucket:
        return {"refused": f"task {source_id} names a checkpoint in another bucket"}
    try:
        stored = fetch(s3, bucket, key, limit=MAX_CHECKPOINT_BYTES)
    except (ClientError, BotoCoreError, OSError) as exc:
        return {"unreadable": f"checkpoint of task {source_id} unreadable ({type(exc).__name__})"}
    if stored is None:
        return {"refused": f"the session checkpoint of task {source_id} is gone from S3"}
    if not stored.whole:
        return {"refused": f"the checkpoint of task {source_id} is too large"}
    _place(task_dir, stored.data)
    return {"continued_from": source_id}


def _place(task_dir: Path, data: bytes) -> None:
    target = task_dir / RESTORE_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _unreadable(request_id: str, attempt: int, exc: BaseException) -> dict[str, Any]:
    logger.warning("checkpoint unreadable; the session starts afresh",
                   extra={"requestId": request_id, "fromAttempt": attempt,
                          "error": type(exc).__name__})  # fmt: skip
    return {"unreadable": f"checkpoint of attempt {attempt} unreadable ({type(exc).__name__})"}


class CheckpointUploader:
    """Uploads a running child's checkpoint to its attempt's parts, only what changed.

    One pass every `interval_s`: the entries added since the last stored part go up as
    the next part (the whole transcript at a snapshot number, or when the child's session
    is no longer the one stored). When stopped (the child gone, the attempt not yet
    settled), the whole checkpoint at the attempt's `checkpoint_key`, or a last part.
    `allowed` is asked before each upload: once the lease is lost nothing more is written.
    """

    def __init__(
        self,
        s3: Any,
        bucket: str,
        lease: Lease,
        task_dir: Path,
        *,
        interval_s: float,
        allowed: Callable[[], bool],
        first_part: int = 1,
        pause: Callable[[float], bool] | None = None,
    ) -> None:
        self._s3, self._bucket, self._lease = s3, bucket, lease
        self._task_dir = task_dir
        self._interval_s = interval_s
        self._allowed = allowed
        self._stopped = threading.Event()
        # Waits between passes, True once stopped (a test drives the passes through it).
        self._pause = pause or self._stopped.wait
        self._last: tuple[int, int] | None = None
        # Past the parts of an earlier run of this attempt number (an operator's retry
        # restarts the count), at a snapshot number: its whole one names the parts it covers.
        self._next_part = first_part
        # The session and entry lines the stored parts hold, and a digest of those lines.
        self._stored: tuple[str, int, bytes] | None = None
        self._final: str | None = None
        self.uploads = 0
        self._thread = threading.Thread(target=self._loop, name="checkpoint", daemon=True)

    def start(self) -> CheckpointUploader:
        self._thread.start()
        return self

    def stop(self) -> None:
        """The whole checkpoint at the attempt's key (what the views, a continuation and a
        retry read in one request); if it cannot go up, a last part instead."""
        self._stopped.set()
        if self._thread.ident is not None:
            self._thread.join()
        read = self._read(changed_only=False)
        if read is None:
            return
        whole = self._transcript(*read)
        if whole is None:
            return  # never named as the final checkpoint
        key = checkpoint_key(self._lease.tenant, self._lease.request_id, self._lease.attempt)
        if self._put(key, encode_whole(whole, parts=self._next_part - 1)):
            self._final = key
        else:
            self._send(read[0], whole)

    @property
    def final_key(self) -> str | None:
        """The key of the attempt's whole last checkpoint, once stopped (what a
        continuation of the task starts from); None if it could not be stored."""
        return self._final

    def _loop(self) -> None:
        while not self._pause(self._interval_s):
            self.sync()

    def sync(self) -> bool:
        """Upload the entries added since the last stored part; True if a part went up."""
        read = self._read(changed_only=True)
        whole = None if read is None else self._transcript(*read)
        return read is not None and whole is not None and self._send(read[0], whole)

    def _read(self, *, changed_only: bool) -> tuple[tuple[int, int], bytes] | None:
        """The checkpoint file and its version (with `changed_only`, only if it changed
        since the last pass that stored it), when it may be uploaded."""
        if not self._allowed():
            return None
        # The child owns the directory: a link or FIFO it left there is not read.
        opened = open_plain(self._task_dir / CHECKPOINT_FILE)
        if opened is None:
            return None
        with opened as source:
            info = os.fstat(source.fileno())
            version = (info.st_size, info.st_mtime_ns)
            if (changed_only and version == self._last) or info.st_size > MAX_CHECKPOINT_BYTES:
                return None
            return version, source.read(MAX_CHECKPOINT_BYTES + 1)

    def _transcript(self, version: tuple[int, int], data: bytes) -> Part | None:
        """The file's whole transcript; None (and not looked at again) if unreadable."""
        try:
            return split(data)
        except CheckpointError as exc:
            # The child rewrites the file whole; a file it left unreadable is never sent.
            logger.warning("checkpoint file unreadable", extra={"problem": str(exc)})
            self._last = version
            return None

    def _send(self, version: tuple[int, int], whole: Part) -> bool:
        """The next part: the lines after the stored ones, else (a snapshot number, or
        the stored lines no longer its beginning) all of them. True if one went up."""
        stored, lines = self._stored, whole.lines
        kept = 0  # how many of the lines the stored parts already hold
        if (stored is not None and stored[0] == whole.session_id and stored[1] <= len(lines)
                and _digest(lines[: stored[1]]) == stored[2]):  # fmt: skip
            kept = stored[1]
        if kept and kept == len(lines):
            self._last = version
            return False
        first = 0 if is_snapshot(self._next_part) else kept
        part = dataclasses.replace(whole, first_entry=first, lines=lines[first:])
        key = part_key(self._lease.tenant, self._lease.request_id, self._lease.attempt,
                       self._next_part)  # fmt: skip
        if not self._put(key, encode_part(part)):
            return False  # the next pass sends this part again, with what came since
        self._stored = (whole.session_id, len(lines), _digest(lines))
        self._next_part += 1
        self.uploads += 1
        self._last = version
        return True

    def _put(self, key: str, data: bytes) -> bool:
        try:
            # Scrubbed into a file botocore can rewind: a retried PutObject sends the same bytes.
            with tempfile.TemporaryFile(dir=self._task_dir.parent) as body:
                scrub_file(io.BytesIO(data), body)
                body.seek(0)
                self._s3.put_object(Bucket=self._bucket, Key=key, Body=body,
                                    ContentType="application/x-ndjson")  # fmt: skip
        except (ClientError, BotoCoreError, OSError):
            # The previous parts stay the resume point; the next pass tries again.
            logger.warning("checkpoint upload failed", extra={"key": key}, exc_info=True)
            return False
        return True


def _digest(lines: list[bytes]) -> bytes:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line + b"\n")
    return digest.digest()
