"""Reading every task of a job from its STATE item, in BatchGetItem pages.

Strongly consistent and never through the byJob index: the dispatcher decides from
it, and an index read could miss a transition that just happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from agentq.jobs.spec import task_request_id
from agentq.store import TaskRecord, keys
from agentq.store.batchread import batch_get

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
        chunk = [
            keys.state_key(tenant, rid) for rid in request_ids[start : start + _BATCH_GET_LIMIT]
        ]
        # Unprocessed keys (throttling) are asked for again with a growing pause.
        items, unread = batch_get(
            dynamodb, table, chunk, attempts=_BATCH_GET_ATTEMPTS, base_s=0.05, cap_s=2.0
        )
        for item in items:
            record = TaskRecord.from_item(item)
            found[by_request[record.request_id]] = record
        if unread:
            raise RuntimeError(f"job {job_id}: task states unreadable (throttled)")
    return found
