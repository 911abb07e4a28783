"""A task's objects in S3: the listing, its logs and agent trace inline, raw downloads.

Where a task's objects live is not decided here: `TaskOutputs.location`, the one place
that turns a STATE item into its attempt's folder (the client's `logs` and `trace` use
it too), names it, so the console reads the same objects as the CLI. Reads are bounded
(log tails, a size cap on the trace and result) so a huge object cannot stall a page,
and a finished task's artifacts are cached: they never change once it is terminal.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.errors import InvalidInput, NoOutputYet, NotFound
from agentq.jobs.results import RESULT_FILE, ResultReader
from agentq.json_text import decode_lenient
from agentq.states import TaskState
from agentq.store import TaskRecord
from agentq.task_outputs import TaskOutputs, readable_trace

MAX_LOG_BYTES: Final = 256 * 1024
MAX_INLINE_BYTES: Final = 2 * 1024 * 1024
MAX_LOGS: Final = 8
_CACHE_SIZE: Final = 512
TRACE_NAME: Final = "traces/session_trace.json"


class TaskArtifacts:
    def __init__(self, s3: Any, results: ResultReader, outputs: TaskOutputs) -> None:
        self._s3 = s3
        self._results = results
        self.outputs = outputs
        self._cache: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, record: TaskRecord) -> dict[str, Any]:
        cache_key = (record.tenant, record.request_id, record.attempt, record.state.value,
                     record.updated_at_ms)  # fmt: skip
        with self._lock:
            if cache_key in self._cache:
                self._cache.move_to_end(cache_key)
                return self._cache[cache_key]
        found = self._read(record)
        if record.state.terminal:
            with self._lock:
                self._cache[cache_key] = found
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return found

    def _read(self, record: TaskRecord) -> dict[str, Any]:
        try:
            bucket, prefix = self.outputs.location(record)
        except NoOutputYet as early:
            return {"location": None, "objects": [], "logs": [], "trace": None,
                    "result": None, "resultState": str(early)}  # fmt: skip
        listing = self._s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000)
        objects: list[dict[str, Any]] = [
            {"name": str(o["Key"])[len(prefix) :], "size": int(o["Size"])}
            for o in listing.get("Contents", [])
        ]
        sizes: dict[str, int] = {o["name"]: o["size"] for o in objects}
        logs = []
        for name in sorted(n for n in sizes if n.startswith("logs/"))[:MAX_LOGS]:
            text, truncated = self._tail(bucket, prefix + name, sizes[name])
            logs.append({"name": name, "text": text, "truncated": truncated})
        trace = None
        if 0 < sizes.get(TRACE_NAME, 0) <= MAX_INLINE_BYTES:
            trace = readable_trace(self._json(bucket, prefix + TRACE_NAME))
        result: Any = None
        # Only a completed task has a result; say why the others have none.
        result_state = (f"left no result (it ended {record.state.value})" if record.state.terminal
                        else f"no result yet (attempt {record.attempt} is {record.state.value})")  # fmt: skip
        if record.state is TaskState.COMPLETED:
            size = sizes.get(RESULT_FILE)
            if size is not None and size > MAX_INLINE_BYTES:
                result_state = "too large to show inline"
            else:
                try:
                    result, result_state = self._results.load(record), "loaded"
                except (NotFound, InvalidInput) as problem:
                    result_state = str(problem)
        return {
            "location": f"s3://{bucket}/{prefix}",
            "objects": objects,
            "logs": logs,
            "trace": trace,
            "result": result,
            "resultState": result_state,
        }

    def raw(self, record: TaskRecord, name: str) -> tuple[bytes, bool]:
        """One of the task's objects by its listed name; (body, truncated)."""
        # The name is refused before anything is looked up: a bad name is bad input
        # whether or not the task has objects yet.
        if not name or ".." in name.split("/") or name.startswith("/"):
            raise InvalidInput("name", "not an object of this task")
        bucket, prefix = self.outputs.location(record)
        try:
            response = self._s3.get_object(
                Bucket=bucket, Key=prefix + name, Range=f"bytes=0-{MAX_INLINE_BYTES - 1}"
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "InvalidRange"):
                raise NotFound("task object", name) from None
            raise
        body = response["Body"].read()
        total = _total_size(response, len(body))
        return body, total > len(body)

    def _tail(self, bucket: str, key: str, size: int) -> tuple[str, bool]:
        if size == 0:
            return "", False
        start = max(0, size - MAX_LOG_BYTES)
        body = self._s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-")["Body"].read()
        return body.decode("utf-8", errors="replace"), start > 0

    def _json(self, bucket: str, key: str) -> Any:
        body = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        try:
            return decode_lenient(body, name=key)
        except InvalidInput:  # the task wrote it: shown as missing, not as a 500
            return None


def _total_size(response: dict[str, Any], read: int) -> int:
    content_range = str(response.get("ContentRange") or "")
    if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
        return int(content_range.rsplit("/", 1)[1])
    return read
