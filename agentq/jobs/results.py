"""Reading a completed task's result from S3.

The worker uploads the winning attempt's `artifacts/task-result.json` under
`s3://{bucket}/task/{tenant}/{requestId}/attempt-{n}/` and records that location on the
STATE item (`result = {"bucket", "key"}`) in the same lease-token-conditional write that
completes the task. The pointer is the only way to a result: no key is guessed (a
guessed key could be a stale attempt's), and a pointer outside the task's own tenant-
and request-scoped folder is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.errors import InvalidInput, NotFound
from agentq.store import TaskRecord
from agentq.store.keys import attempt_prefix, task_prefix

RESULT_FILE: Final = "artifacts/task-result.json"


def result_key(tenant: str, request_id: str, attempt: int) -> str:
    """Where an attempt's result goes (the worker writes it; readers follow the pointer)."""
    return f"{attempt_prefix(tenant, request_id, attempt)}{RESULT_FILE}"


def artifacts_pointer(record: TaskRecord) -> tuple[str, str] | None:
    """(bucket, prefix) of the objects of the attempt the STATE item names, if any."""
    stored = record.raw.get("artifacts")
    if not isinstance(stored, Mapping):
        return None
    bucket, prefix = stored.get("bucket"), stored.get("prefix")
    if not isinstance(bucket, str) or not isinstance(prefix, str):
        return None
    _check_scope(record, prefix)
    return bucket, prefix


def _check_scope(record: TaskRecord, key: str) -> None:
    if not key.startswith(task_prefix(record.tenant, record.request_id)):
        raise InvalidInput("result", f"task {record.request_id} points outside its own objects")


class ResultReader:
    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3 = s3
        self._bucket = bucket

    def pointer(self, record: TaskRecord) -> tuple[str, str]:
        stored = record.raw.get("result")
        if not isinstance(stored, Mapping) or not isinstance(stored.get("key"), str):
            raise NotFound("task result", record.request_id)
        key = str(stored["key"])
        _check_scope(record, key)
        return str(stored.get("bucket") or self._bucket), key

    def files(self, record: TaskRecord) -> dict[str, str]:
        """Name within the named attempt's folder → S3 key (logs, traces, artifacts)."""
        named = artifacts_pointer(record)
        if named is None:
            return {}
        bucket, prefix = named
        found: dict[str, str] = {}
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                found[str(obj["Key"])[len(prefix) :]] = str(obj["Key"])
        return found

    def load(self, record: TaskRecord) -> Any:
        bucket, key = self.pointer(record)
        try:
            body = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NoSuchBucket"):
                raise NotFound("task result", f"s3://{bucket}/{key}") from None
            raise
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"s3://{bucket}/{key}", f"result is not JSON: {exc.msg}") from None
