"""Agent session checkpoints in S3, moved by the worker on its child's behalf.

Key: `{attempt prefix}checkpoint/session.jsonl` (`checkpoint_key`), so a holder writes only
its own attempt's checkpoint and a stale one can never replace the winner's. While a
resumable task runs, `CheckpointUploader` uploads the child's checkpoint file when it
changed, at most once per AGENT_CHECKPOINT_INTERVAL, scrubbed like every upload.
`restore` puts the newest checkpoint at or below this attempt into the new task dir
(attempt numbers are never reused once a child ran, so only earlier attempts have one); a
missing one is no resume, one that cannot be read is a fresh start the child records.
`restore_source` puts the final checkpoint of the task a continuation continues there.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.continuation import ContinueRefused, source_checkpoint
from agentq.store import TaskRecord
from agentq.store.keys import checkpoint_key
from worker.child.files import open_plain
from worker.kinds.agent.checkpoint import CHECKPOINT_FILE, MAX_CHECKPOINT_BYTES, RESTORE_FILE
from worker.settle.scrub import scrub_file

__all__ = ["CheckpointUploader", "checkpoint_key", "restore", "restore_source", "resumable"]

logger = logging.getLogger(__name__)

# Without s3:ListBucket, S3 answers a missing key with 403 (agentq/local/rules/s3_missing_key.py).
MISSING: Final = frozenset({"NoSuchKey", "404", "AccessDenied", "403"})


def resumable(kind: str, settings: Mapping[str, Any]) -> bool:
    """An agent definition that opted in (the child checks the spec whole)."""
    return kind == "agent" and settings.get("resume") is True


def restore(
    s3: Any, bucket: str, *, tenant: str, request_id: str, attempt: int, task_dir: Path
) -> dict[str, Any] | None:
    """Fetch the newest checkpoint at or below `attempt` into the task dir.

    Returns what the child is told (task.json's `resume`): `{"from_attempt": n}` with the
    file in place, `{"unreadable": why}`, or None when no attempt left one.
    """
    for earlier in range(attempt, 0, -1):
        try:
            data = _fetch(s3, bucket, checkpoint_key(tenant, request_id, earlier))
        except _TooLarge:
            return {"unreadable": f"checkpoint of attempt {earlier} is too large"}
        except (ClientError, BotoCoreError, OSError) as exc:
            # botocore already retried a throttle or a dropped connection.
            return _unreadable(request_id, earlier, exc)
        if data is not None:
            _place(task_dir, data)
            return {"from_attempt": earlier}
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
        data = _fetch(s3, bucket, key)
    except _TooLarge:
        return {"refused": f"the checkpoint of task {source_id} is too large"}
    except (ClientError, BotoCoreError, OSError) as exc:
        return {"unreadable": f"checkpoint of task {source_id} unreadable ({type(exc).__name__})"}
    if data is None:
        return {"refused": f"the session checkpoint of task {source_id} is gone from S3"}
    _place(task_dir, data)
    return {"continued_from": source_id}


class _TooLarge(Exception):
    """A checkpoint over MAX_CHECKPOINT_BYTES: never read whole."""


def _fetch(s3: Any, bucket: str, key: str) -> bytes | None:
    """A checkpoint's bytes; None when there is none (404, or 403 for a reader without
    ListBucket). Raises `_TooLarge`, or what S3 and botocore raise after their retries."""
    try:
        found = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in MISSING:
            return None
        raise
    if found.get("ContentLength", 0) > MAX_CHECKPOINT_BYTES:
        raise _TooLarge(key)
    data: bytes = found["Body"].read(MAX_CHECKPOINT_BYTES + 1)
    return data


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
    """Uploads a running child's checkpoint file to its attempt's key, when it changed.

    One pass every `interval_s`, and a last one when stopped (after the child is gone,
    before the attempt settles, so a retry finds the latest turn). `allowed` is asked
    before each upload: once the attempt's lease is lost nothing more is written.
    """

    def __init__(
        self,
        s3: Any,
        bucket: str,
        key: str,
        task_dir: Path,
        *,
        interval_s: float,
        allowed: Callable[[], bool],
    ) -> None:
        self._s3, self._bucket, self._key = s3, bucket, key
        self._task_dir = task_dir
        self._interval_s = interval_s
        self._allowed = allowed
        self._stopped = threading.Event()
        self._last: tuple[int, int] | None = None
        self._behind = False  # the file changed since the last upload that worked
        self.uploads = 0
        self._thread = threading.Thread(target=self._loop, name="checkpoint", daemon=True)

    def start(self) -> CheckpointUploader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self.sync()

    @property
    def final_key(self) -> str | None:
        """The key, once stopped, if it holds the attempt's last checkpoint (what a
        continuation of the task starts from); None if nothing or not the last one is."""
        return self._key if self.uploads and not self._behind else None

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self.sync()

    def sync(self) -> bool:
        """Upload the checkpoint if it changed since the last upload; True if it did."""
        if not self._allowed():
            return False
        # The child owns the directory: a link or FIFO it left there is not read.
        opened = open_plain(self._task_dir / CHECKPOINT_FILE)
        if opened is None:
            return False
        with opened as source:
            info = os.fstat(source.fileno())
            version = (info.st_size, info.st_mtime_ns)
            if version == self._last:
                return False
            if info.st_size > MAX_CHECKPOINT_BYTES:
                return False
            try:
                self._put(source)
            except (ClientError, BotoCoreError, OSError):
                # The next pass tries again; the previous checkpoint stays the resume point.
                logger.warning("checkpoint upload failed", extra={"key": self._key},
                               exc_info=True)  # fmt: skip
                self._behind = True
                return False
        self._last, self._behind = version, False
        self.uploads += 1
        return True

    def _put(self, source: Any) -> None:
        # Scrubbed into a file botocore can rewind: a retried PutObject sends the same bytes.
        with tempfile.TemporaryFile(dir=self._task_dir.parent) as body:
            scrub_file(source, body)
            body.seek(0)
            self._s3.put_object(Bucket=self._bucket, Key=self._key, Body=body,
                                ContentType="application/x-ndjson")  # fmt: skip
