"""Uploads a task attempt's output directory to its own S3 folder.

`s3://{bucket}/task/{tenant}/{requestId}/attempt-{n}/` (agentq.store.keys): a worker
that lost its lease while frozen uploads only into its own attempt's folder, so it can
never replace the objects the STATE item names for the attempt that won.
"""

from __future__ import annotations

import mimetypes
import shutil
from pathlib import Path
from typing import Any, Final

from agentq.security import redact_known_bytes
from agentq.store.keys import attempt_prefix

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
        body = redact_known_bytes(path.read_bytes())
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        keys.append(key)
    return keys


def _plain_file_inside(path: Path, root: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    return path.resolve().is_relative_to(root)


def remove(task_dir: Path) -> None:
    shutil.rmtree(task_dir, ignore_errors=True)
