"""Reading a completed task's result from S3.

The worker uploads the winning attempt's `artifacts/task-result.json` under
`s3://{bucket}/task/{tenant}/{requestId}/attempt-{n}/` and records that location on the
STATE item (`result = {"bucket", "key"}`) in the same lease-token-conditional write that
completes the task. The pointer is the only way to a result: no key is guessed (a
guessed key could be a stale attempt's), and a pointer outside the task's own tenant-
and request-scoped folder is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.errors import InvalidInput, NotFound
from agentq.json_text import decode_json, decode_lenient
from agentq.store import TaskRecord
from agentq.store.keys import attempt_prefix, task_prefix

RESULT_FILE: Final = "artifacts/task-result.json"
# What the dispatcher reads to resolve one task's input (a Lambda of 512 MiB): a result
# bigger than this cannot be referenced, and all those one input references together
# stay under the total. A whole result substituted must fit the 256 KiB envelope anyway.
MAX_REFERENCED_RESULT_BYTES: Final = 1024 * 1024
MAX_REFERENCED_BYTES: Final = 8 * 1024 * 1024
# What S3 answers a GetObject of a missing key when the caller may not list the bucket.
_MISSING_OR_DENIED: Final = frozenset({"AccessDenied", "403"})


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

    @property
    def bucket(self) -> str:
        """The stage's artifacts bucket (where a pointer names none)."""
        return self._bucket

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
        """The result as the task wrote it (for its producer: no size limit)."""
        bucket, key = self.pointer(record)
        body = self._get(bucket, key).read()
        return decode_lenient(body, name=f"s3://{bucket}/{key}", what="result")

    def load_referenced(self, record: TaskRecord, *, limit: int) -> tuple[Any, int]:
        """The result a job reference reads, and its size: refused (`InvalidInput`) past
        `limit` bytes before it is read, or when not strict JSON (too deep, `NaN`), so
        the task code's output cannot exhaust or crash the dispatcher."""
        bucket, key = self.pointer(record)
        where = f"s3://{bucket}/{key}"
        response = self._get(bucket, key, whole=True)
        size = int(response.get("ContentLength") or 0)
        if size > limit:
            response["Body"].close()
            raise InvalidInput(
                where, f"result is {size} bytes; a job reference reads at most {limit}"
            )
        body = response["Body"].read(limit + 1)
        try:
            return decode_json(body.decode("utf-8"), name=where), len(body)
        except UnicodeDecodeError:
            raise InvalidInput(where, "result is not UTF-8 text") from None

    def _get(self, bucket: str, key: str, *, whole: bool = False) -> Any:
        try:
            response = self._s3.get_object(Bucket=bucket, Key=key)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NoSuchBucket"):
                raise NotFound("task result", f"s3://{bucket}/{key}") from None
            if code in _MISSING_OR_DENIED:
                # S3 answers a missing key with 403 to a reader without s3:ListBucket
                # (the dispatcher and the reconciler have none): not there, for them.
                raise NotFound(
                    "task result", f"s3://{bucket}/{key} (missing, or not readable: {code})"
                ) from None
            raise
        return response if whole else response["Body"]


class ReferencedResults:
    """The results one task's input references, each read once, within the budget."""

    def __init__(self, reader: ResultReader, where: str) -> None:
        self._reader = reader
        self._where = where
        self._budget = MAX_REFERENCED_BYTES
        self._cache: dict[str, Any] = {}

    def of(self, record: TaskRecord) -> Any:
        if record.request_id not in self._cache:
            if self._budget <= 0:
                raise InvalidInput(self._where, "the results it references exceed "
                                   f"{MAX_REFERENCED_BYTES} bytes together")  # fmt: skip
            limit = min(MAX_REFERENCED_RESULT_BYTES, self._budget)
            value, size = self._reader.load_referenced(record, limit=limit)
            self._cache[record.request_id] = value
            self._budget -= size
        return self._cache[record.request_id]
