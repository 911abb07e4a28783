"""Reading a completed task's result from S3.

The worker uploads `artifacts/task-result.json` to
`s3://{bucket}/task/logs/{requestId}/artifacts/task-result.json` and may record the
location on the STATE item as `result = {"bucket", "key"}`; the pointer wins, the
conventional key is the fallback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from agentq.errors import InvalidInput, NotFound
from agentq.resources import ARTIFACTS_PREFIX
from agentq.store import TaskRecord

RESULT_FILE = "artifacts/task-result.json"


def result_key(request_id: str) -> str:
    return f"{ARTIFACTS_PREFIX}{request_id}/{RESULT_FILE}"


class ResultReader:
    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3 = s3
        self._bucket = bucket

    def pointer(self, record: TaskRecord) -> tuple[str, str]:
        stored = record.raw.get("result")
        if isinstance(stored, Mapping) and stored.get("key"):
            return str(stored.get("bucket") or self._bucket), str(stored["key"])
        return self._bucket, result_key(record.request_id)

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
