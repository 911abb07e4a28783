"""Key layout of the events table and of a task's S3 objects.

Task STATE `TASK#{tenant}#{requestId}` / `STATE`, its events `EVENT#{iso}#{eventId}`
under the same key, jobs `JOB#{tenant}#{jobId}` / `JOB`; the index keys beside them.
A task's S3 objects are keyed the same way and by attempt
(`task/{tenant}/{requestId}/attempt-{n}/`, `attempt_prefix`); readers follow the STATE
item's pointer to the winning attempt, never a key they build. docs/architecture.md,
"Table layout" and "S3 layout", has the tables.
"""

from __future__ import annotations

from typing import Any, Final

from agentq.resources import ARTIFACTS_PREFIX, JOB_PK_PREFIX, TASK_PK_PREFIX, status_shard

STATE_SK: Final = "STATE"
JOB_SK: Final = "JOB"
EVENT_SK_PREFIX: Final = "EVENT#"
_DUE_DIGITS: Final = 15


def task_pk(tenant: str, request_id: str) -> str:
    return f"{TASK_PK_PREFIX}{tenant}#{request_id}"


def job_pk(tenant: str, job_id: str) -> str:
    return f"{JOB_PK_PREFIX}{tenant}#{job_id}"


def event_sk(timestamp_iso: str, event_id: str) -> str:
    return f"{EVENT_SK_PREFIX}{timestamp_iso}#{event_id}"


def status_pk(state: str, request_id: str) -> str:
    return status_partition(state, status_shard(request_id))


def status_partition(state: str, shard: int) -> str:
    return f"STATUS#{state}#{shard}"


def status_sk(due_ms: int, tenant: str, request_id: str) -> str:
    # Zero-padded so string order is time order in the index.
    return f"{due_ms:0{_DUE_DIGITS}d}#{tenant}#{request_id}"


def running_job_partition(shard: int) -> str:
    """RUNNING jobs share the status index with tasks, in partitions of their own."""
    return f"JOBSTATUS#RUNNING#{shard}"


def running_job_pk(job_id: str) -> str:
    return running_job_partition(status_shard(job_id))


def due_bound(before_ms: int) -> str:
    """Every status sort key due strictly before `before_ms` sorts below this."""
    return f"{before_ms:0{_DUE_DIGITS}d}"


def tenant_events_pk(tenant: str) -> str:
    return f"EVENTS#{tenant}"


def tenant_jobs_pk(tenant: str) -> str:
    return f"JOBS#{tenant}"


def type_pk(app_name: str, detail_type: str) -> str:
    return f"TYPE#{app_name}#{detail_type}"


def task_prefix(tenant: str, request_id: str) -> str:
    """Every S3 object of one tenant's task (all its attempts)."""
    return f"{ARTIFACTS_PREFIX}{tenant}/{request_id}/"


def attempt_prefix(tenant: str, request_id: str, attempt: int) -> str:
    """The S3 objects one attempt wrote: a stale holder's land here, never in the winner's."""
    return f"{task_prefix(tenant, request_id)}attempt-{attempt}/"


# An agent attempt's session checkpoint, under its attempt's own prefix (fenced like it).
CHECKPOINT_NAME: Final = "checkpoint/session.jsonl"


def checkpoint_key(tenant: str, request_id: str, attempt: int) -> str:
    return attempt_prefix(tenant, request_id, attempt) + CHECKPOINT_NAME


def state_key(tenant: str, request_id: str) -> dict[str, Any]:
    """The DynamoDB key of a task's STATE item."""
    return {"PK": {"S": task_pk(tenant, request_id)}, "SK": {"S": STATE_SK}}
