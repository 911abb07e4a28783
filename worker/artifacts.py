"""Uploads a task's output directory to `s3://{bucket}/task/logs/{requestId}/`."""

from __future__ import annotations

import mimetypes
import shutil
from pathlib import Path
from typing import Any, Final

from agentq.resources import ARTIFACTS_PREFIX
from agentq.security import redact_known_bytes

UPLOADED_DIRS: Final = ("artifacts", "logs", "traces")
UPLOADED_FILES: Final = ("error.json", "usage.json")


def prefix_for(request_id: str) -> str:
    return f"{ARTIFACTS_PREFIX}{request_id}/"


def upload_outputs(s3: Any, bucket: str, request_id: str, task_dir: Path) -> list[str]:
    """Upload what the child left; returns the keys written."""
    prefix = prefix_for(request_id)
    paths: list[Path] = []
    for name in UPLOADED_DIRS:
        root = task_dir / name
        if root.is_dir():
            paths.extend(p for p in sorted(root.rglob("*")) if p.is_file())
    paths.extend(task_dir / n for n in UPLOADED_FILES if (task_dir / n).is_file())
    keys = []
    for path in paths:
        key = prefix + path.relative_to(task_dir).as_posix()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        # The worker's own secret values never leave in what the task wrote.
        body = redact_known_bytes(path.read_bytes())
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        keys.append(key)
    return keys


def remove(task_dir: Path) -> None:
    shutil.rmtree(task_dir, ignore_errors=True)
