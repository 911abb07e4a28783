"""Uploads a task attempt's output directory to its own S3 folder.

`s3://{bucket}/task/{tenant}/{requestId}/attempt-{n}/` (agentq.store.keys): a worker
that lost its lease while frozen uploads only into its own attempt's folder, so it can
never replace the objects the STATE item names for the attempt that won.

Each file is scrubbed of the worker's secrets into an unnamed temporary file beside the
task directories (worker/settle/scrub.py streams it: a large output costs a chunk of memory,
not its size) and that file is the upload's body. botocore rewinds a file body when it
retries, so a throttled or failed-after-applied PutObject sends the same bytes again to
the same attempt-scoped key; a worker that dies mid-upload leaves nothing the STATE
item names (its finalize never ran).
"""

from __future__ import annotations

import mimetypes
import os
import shutil
import tempfile
from io import BufferedReader
from pathlib import Path
from typing import Any, Final

from agentq.store.keys import attempt_prefix
from worker.settle.scrub import scrub_file

UPLOADED_DIRS: Final = ("artifacts", "logs", "traces")
UPLOADED_FILES: Final = ("error.json", "usage.json")

__all__ = ["UPLOADED_DIRS", "UPLOADED_FILES", "attempt_prefix", "remove", "upload_outputs"]


def upload_outputs(s3: Any, bucket: str, prefix: str, task_dir: Path) -> list[str]:
    """Upload what the child left under `prefix`; returns the keys written."""
    paths: list[Path] = []
    for name in UPLOADED_DIRS:
        root = task_dir / name
        if root.is_dir() and not root.is_symlink():
            paths.extend(sorted(root.rglob("*")))
    paths.extend(task_dir / n for n in UPLOADED_FILES)
    keys = []
    inside = task_dir.resolve()
    for path in paths:
        # The child owns this directory: a link it left (to the worker's environment in
        # /proc, say) would be read with the worker's rights and handed to the tenant.
        if not _plain_file_inside(path, inside):
            continue
        key = prefix + path.relative_to(task_dir).as_posix()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        # The worker's own secret values never leave in what the task wrote.
        with _open_plain(path) as source, tempfile.TemporaryFile(dir=task_dir.parent) as body:
            scrub_file(source, body)
            body.seek(0)
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        keys.append(key)
    return keys


def _open_plain(path: Path) -> BufferedReader:
    # O_NOFOLLOW: the file checked above is the file read, even if a link took its place.
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def _plain_file_inside(path: Path, root: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    return path.resolve().is_relative_to(root)


def remove(task_dir: Path) -> None:
    shutil.rmtree(task_dir, ignore_errors=True)
