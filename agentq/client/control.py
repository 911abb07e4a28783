"""Following a task or job to its end (`wait`) and ending it early (`cancel`), for
`AgentqClient`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from agentq.client.parts import ClientParts
from agentq.errors import AgentqError, InvalidInput, NotCancellable
from agentq.events import Event
from agentq.jobs import JobRecord
from agentq.jobs.retry import RetryAnswer, retry_job_task
from agentq.store import TaskRecord
from agentq.store.scheduling import NOT_STARTED, CancelOutcome, request_cancel


@dataclass(frozen=True)
class CancelAnswer:
    """What a cancel did to one task.

    `outcome`: "cancelled" (it had not started, or no attempt held it: CANCELLED now,
    its `Task Cancelled` sent) or "requested" (an attempt runs it: that attempt is
    stopped within one heartbeat and records `Task Cancelled`; no new attempt starts).
    `state`: the task's state as the cancel left it (CANCELLED, or PROCESSING).
    """

    request_id: str
    outcome: CancelOutcome
    state: str

    def to_dict(self) -> dict[str, str]:
        return {"requestId": self.request_id, "outcome": self.outcome, "state": self.state}


class WaitTimeout(AgentqError):
    """`wait` gave up; the task or job is still running (`state` says where it is)."""

    def __init__(self, what: str, state: str, timeout_s: float) -> None:
        self.what = what
        self.state = state
        self.timeout_s = timeout_s
        super().__init__(f"{what} still {state} after {timeout_s:g}s")


class TaskControl:
    """Waiting and cancelling: the part of `AgentqClient` that follows and ends tasks."""

    def __init__(self, parts: ClientParts) -> None:
        self._parts = parts

    # -- waiting --------------------------------------------------------------------------
    def wait(
        self,
        request_id: str | None = None,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        timeout_s: float = 300.0,
        poll_s: float = 1.0,
    ) -> TaskRecord | JobRecord:
        """Poll the STATE item (or job item) until terminal; `WaitTimeout` after timeout_s."""
        if (request_id is None) == (job_id is None):
            raise InvalidInput("wait", "give exactly one of request_id or job_id")
        deadline = time.monotonic() + timeout_s
        while True:
            current: TaskRecord | JobRecord
            state: str
            if job_id is not None:
                current = self._parts.get_job(job_id, tenant=tenant)
                done, state = current.state != "RUNNING", current.state
            else:
                assert request_id is not None
                current = self._parts.get_task(request_id, tenant=tenant)
                done, state = current.state.terminal, current.state.value
            if done:
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                what = f"job {job_id}" if job_id else f"task {request_id}"
                raise WaitTimeout(what, state, timeout_s)
            time.sleep(min(poll_s, remaining))

    # -- cancelling -----------------------------------------------------------------------
    def cancel(
        self,
        request_id: str | None = None,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        reason: str = "cancelled by request",
    ) -> list[CancelAnswer]:
        """Cancel a task, or every task of a job that has not started.

        A task not started is CANCELLED at once (outcome "cancelled"); a running one is
        asked to stop (outcome "requested": its worker stops the child within one
        heartbeat and records `Task Cancelled`, and no new attempt of it starts).
        Returns one `CancelAnswer` per task cancelled or asked to stop now. A task that
        had already finished keeps its outcome: cancelling it raises `NotCancellable`,
        whose `state` says how it ended (a job-wide cancel skips such tasks). A job
        task's cancellation applies the job's failure policy, and a job whose tasks are
        all terminal is closed.
        """
        if (request_id is None) == (job_id is None):
            raise InvalidInput("cancel", "give exactly one of request_id or job_id")
        tenant = tenant or self._parts.settings.tenant_id
        if job_id is not None:
            job = self._parts.get_job(job_id, tenant=tenant)
            targets = [
                record
                for record in self._parts.job_tasks(job).values()
                if record is not None and record.state in NOT_STARTED
            ]
        else:
            assert request_id is not None
            targets = [self._parts.get_task(request_id, tenant=tenant)]
        done: list[CancelAnswer] = []
        for record in targets:
            try:
                result = request_cancel(
                    self._parts.tasks, self._parts.dynamodb, self._parts.table_name, record, reason
                )
            except NotCancellable:
                if job_id is not None:
                    continue  # finished meanwhile: nothing to do for a job-wide cancel
                raise
            done.append(CancelAnswer(record.request_id, result.outcome,
                                     result.record.state.value))  # fmt: skip
            if result.outcome == "cancelled":
                stored = result.record.raw.get("terminalEvent")
                if isinstance(stored, Mapping):
                    self._parts.publisher.publish(Event.from_detail(stored))
        for affected in {r.job_id for r in targets if r.job_id}:
            self._parts.dispatcher.reconcile(tenant, affected, trigger=f"cancel-{uuid.uuid4().hex}")
        return done

    # -- retrying -------------------------------------------------------------------------
    def retry(
        self, job_id: str, key: str, *, tenant: str | None = None, retry_key: str | None = None
    ) -> RetryAnswer:
        """Run a job's FAILED or TIMEOUT task again (agentq.jobs.retry): PENDING with a
        fresh attempt budget, the job counting it again. The same `retry_key` twice is
        one retry (give one to make a retried call safe); `NotRetryable` otherwise."""
        return retry_job_task(self._parts, tenant=tenant or self._parts.settings.tenant_id,
                              job_id=job_id,
                              key=key, retry_key=retry_key or uuid.uuid4().hex)  # fmt: skip
