"""Reading every task of a job from its STATE item, in BatchGetItem pages.

Strongly consistent and never through the byJob index: the dispatcher decides from
it, and an index read could miss a transition that just happened.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

from agentq.jobs.spec import task_request_id
from agentq.store import TaskRecord, keys

_BATCH_GET_LIMIT: Final = 100
_BATCH_GET_ATTEMPTS: Final = 8


def read_task_states(
    dynamodb: Any, table: str, tenant: str, job_id: str, task_keys: Iterable[str]
) -> dict[str, TaskRecord | None]:
    """Each task's record by key, in the order given (None: not created yet)."""
    ordered = list(task_keys)
    by_request = {task_request_id(job_id, key): key for key in ordered}
    found: dict[str, TaskRecord | None] = dict.fromkeys(ordered)
    request_ids = list(by_request)
    for start in range(0, len(request_ids), _BATCH_GET_LIMIT):
        pending: dict[str, Any] = {
            table: {
                "Keys": [
                    {"PK": {"S": keys.task_pk(tenant, rid)}, "SK": {"S": keys.STATE_SK}}
                    for rid in request_ids[start : start + _BATCH_GET_LIMIT]
                ],
                "ConsistentRead": True,
            }
        }
        # Unprocessed keys (throttling) are asked for again with a growing pause.
        for attempt in range(_BATCH_GET_ATTEMPTS):
            if not pending:
                break
            if attempt:
                time.sleep(min(2.0, 0.05 * 2**attempt))
            response = dynamodb.batch_get_item(RequestItems=pending)
            for item in response.get("Responses", {}).get(table, []):
                record = TaskRecord.from_item(item)
                found[by_request[record.request_id]] = record
            pending = response.get("UnprocessedKeys") or {}
        if pending:
            raise RuntimeError(f"job {job_id}: task states unreadable (throttled)")
    return found
