"""Retrying one FAILED or TIMEOUT task of a job: the operator's "run it again".

The task goes back to PENDING with a fresh attempt budget and its message is sent
again; the job stops counting its ending and, if it had closed, is RUNNING again.
Every write is conditional and idempotent (the reset carries a write id derived from
the caller's `retry_key`), in the order uncount, reset, uncount again, send: what a
crash between two steps leaves, and why each is repaired, is in docs/jobs.md
("Retrying a failed task").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from agentq.envelope import TaskEnvelope
from agentq.errors import AgentqError, NotFound
from agentq.jobs.spec import task_request_id, validate_job_id
from agentq.states import TaskState

if TYPE_CHECKING:
    from agentq.client.parts import ClientParts

RETRYABLE: Final = (TaskState.FAILED, TaskState.TIMEOUT)


class NotRetryable(AgentqError):
    """The task is not FAILED or TIMEOUT (or not this job's)."""

    def __init__(self, request_id: str, state: str) -> None:
        self.request_id = request_id
        self.state = state
        super().__init__(f"task {request_id} is {state}: only a FAILED or TIMEOUT task is retried")


@dataclass(frozen=True)
class RetryAnswer:
    request_id: str
    state: str  # what the task is now (PENDING)
    job_state: str  # the job's state after the uncount

    def to_dict(self) -> dict[str, str]:
        return {"requestId": self.request_id, "state": self.state, "jobState": self.job_state}


def retry_write_id(request_id: str, retry_key: str) -> str:
    return "retry-" + hashlib.blake2b(f"{request_id}\0{retry_key}".encode(),
                                      digest_size=12).hexdigest()  # fmt: skip


def retry_job_task(
    client: ClientParts, *, tenant: str, job_id: str, key: str, retry_key: str
) -> RetryAnswer:
    """Retry the task `key` of job `job_id` (see the module's docstring)."""
    job_id = validate_job_id(job_id)
    job = client.get_job(job_id, tenant=tenant)
    if not any(task.key == key for task in job.spec.tasks):
        raise NotFound("task of job " + job_id, key)
    request_id = task_request_id(job_id, key)
    record = client.get_task(request_id, tenant=tenant)
    write_id = retry_write_id(request_id, retry_key)
    # None: this very retry already reset the task (a double click, a retried request).
    ended = record.state if record.state in RETRYABLE else None
    if ended is None and record.raw.get("writeId") != write_id:
        raise NotRetryable(request_id, record.state.value)
    if ended is not None:
        client.jobs.uncount(tenant, job_id, key, ended)
    reset = client.tasks.reset_for_retry(tenant, request_id, write_id=write_id)
    if reset is None:
        latest = client.get_task(request_id, tenant=tenant)
        raise NotRetryable(request_id, latest.state.value)
    reopened = (client.jobs.uncount(tenant, job_id, key, ended) if ended is not None
                else None) or client.get_job(job_id, tenant=tenant)  # fmt: skip
    envelope = TaskEnvelope.from_dict(reset.envelope or {}, default_tenant=tenant)
    client.submitter.enqueue(envelope)
    return RetryAnswer(request_id, reset.state.value, reopened.state)
