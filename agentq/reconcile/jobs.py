"""Stalled jobs: running jobs the dispatcher should have moved on, and did not.

A running job is stalled when, for longer than the bound, a terminal task is not
counted, every task is counted yet the job is open, or a BLOCKED task's dependencies
are all terminal. Candidates come from the status index only (RUNNING job items and
BLOCKED tasks), read through moving cursors (agentq.reconcile.cursor): at most
`page_size` items a partition and run, every job reached within ceil(N / page_size) + 1
runs. The repair is the dispatcher's own idempotent `reconcile` (docs/operations.md,
"The reconciler").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from agentq.errors import AgentqError
from agentq.events import job_event
from agentq.jobs.dispatch import DispatchOutcome, JobDispatcher
from agentq.jobs.store import JobRecord, JobStore
from agentq.publisher import EventPublisher
from agentq.reconcile.cursor import Cursors
from agentq.reconcile.messages import AWS_ERRORS, DEFAULT_PAGE_SIZE
from agentq.reconcile.model import RECONCILER_TRIGGER, Repair
from agentq.resources import STATUS_SHARDS
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore, keys
from agentq.store._dynamo import query_all
from agentq.store.codec import from_item, values

logger = logging.getLogger(__name__)


class StalledJobs:
    def __init__(
        self,
        *,
        jobs: JobStore,
        tasks: TaskStore,
        dispatcher: JobDispatcher,
        publisher: EventPublisher,
        dynamodb: Any,
        table_name: str,
        stall_after_s: int,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        self._jobs = jobs
        self._tasks = tasks
        self._dispatcher = dispatcher
        self._publisher = publisher
        self._ddb = dynamodb
        self._table = table_name
        self._stall_after_ms = stall_after_s * 1000
        self._page_size = page_size
        self.cursors = Cursors(dynamodb, table_name)

    def run(self, now: int, repairs: list[Repair], errors: list[str]) -> None:
        bound = now - self._stall_after_ms
        for tenant, job_id in self._candidates(now, bound, errors):
            try:
                repair = self._check(tenant, job_id, bound)
            except (AgentqError, RuntimeError, *AWS_ERRORS) as error:
                errors.append(f"job {job_id}: {error}")
                continue
            except Exception as error:
                # A job whose data breaks the dispatcher must not stop the repair of every
                # other job, nor the lost-message pass that runs after this one.
                logger.exception("job check failed", extra={"jobId": job_id})
                errors.append(f"job {job_id}: {type(error).__name__}: {error}")
                continue
            if repair is not None:
                repairs.append(repair)

    def running_jobs(self, *, created_before_ms: int) -> list[tuple[str, str]]:
        """(tenant, job id) of RUNNING jobs created before the bound, oldest first."""
        found: list[tuple[str, str, str]] = []
        for shard in range(STATUS_SHARDS):
            items = query_all(
                self._ddb,
                TableName=self._table,
                IndexName="byStatus",
                KeyConditionExpression="statusPK = :pk AND statusSK < :bound",
                ExpressionAttributeValues=values(
                    pk=keys.running_job_partition(shard),
                    bound=keys.due_bound(created_before_ms),
                ),
            )
            for item in items:
                data = from_item(item)
                found.append((str(data["statusSK"]), str(data["tenant"]), str(data["jobId"])))
        return [(tenant, job_id) for _, tenant, job_id in sorted(found)]

    def _candidates(self, now: int, bound: int, errors: list[str]) -> list[tuple[str, str]]:
        """(tenant, job id) of this run's pages: RUNNING jobs created before the bound,
        then the jobs of BLOCKED tasks created before it, each job once."""
        partitions = [
            *(keys.running_job_partition(shard) for shard in range(STATUS_SHARDS)),
            *(keys.status_partition(TaskState.BLOCKED.value, shard)
              for shard in range(STATUS_SHARDS)),
        ]  # fmt: skip
        seen: dict[tuple[str, str], None] = {}

        def visit(partition: str, items: list[dict[str, Any]]) -> None:
            # Only collected here, checked after the walk: the cursor moves first, and a
            # job whose check fails is found again when the cursor next passes it.
            for item in items:
                data = from_item(item)
                tenant, job_id = data.get("tenant"), data.get("jobId")
                if isinstance(tenant, str) and isinstance(job_id, str) and job_id:
                    seen.setdefault((tenant, job_id))

        self.cursors.walk(partitions, bound=keys.due_bound(bound), limit=self._page_size,
                          now_ms=now, errors=errors, visit=visit)  # fmt: skip
        return list(seen)

    def _check(self, tenant: str, job_id: str, bound: int) -> Repair | None:
        job = self._jobs.get(tenant, job_id)
        if job is None or job.state != "RUNNING":
            return None
        states = self._dispatcher.task_states(tenant, job_id, job.spec.keys)
        why = stall_reason(job, states, bound)
        if why is None:
            return None
        outcome = self._dispatcher.reconcile(tenant, job_id, trigger=RECONCILER_TRIGGER)
        if not _changed(outcome):
            return None  # the dispatcher got there between our read and our call
        detail = f"{why}; {_summary(outcome)}"
        event = job_event("Job Repaired", job_id=job_id, tenant=tenant, repair="job_stalled",
                          detail=detail, outcome=outcome.to_dict())  # fmt: skip
        # One id per job and outcome: a re-published record is stored once.
        self._publisher.publish(
            replace(event, event_id=f"job-repaired-{job_id}-{event.timestamp_ms}")
        )
        return Repair(kind="job_stalled", tenant=tenant, subject=job_id, job_id=job_id,
                      detail=detail)  # fmt: skip


def stall_reason(job: JobRecord, states: Mapping[str, TaskRecord | None], bound: int) -> str | None:
    """Why the dispatcher should have moved this job on by now (None: it is not stalled)."""
    uncounted = [
        key
        for key, record in states.items()
        if record is not None and record.state.terminal and key not in job.counted
        and _changed_before(record, bound)
    ]  # fmt: skip
    if uncounted:
        return f"terminal but never counted: {', '.join(sorted(uncounted)[:5])}"
    if job.finished:
        updated = job.raw.get("updatedAt")
        if not isinstance(updated, int) or updated < bound:
            return "every task counted, job not closed"
    for task in job.spec.tasks:
        record = states.get(task.key)
        if record is None or record.state is not TaskState.BLOCKED:
            continue
        deps = [states.get(dep) for dep in task.depends_on]
        if all(d is not None and d.state.terminal and _changed_before(d, bound) for d in deps):
            return f"BLOCKED with every dependency finished: {task.key}"
    return None


def _changed_before(record: TaskRecord, bound: int) -> bool:
    at = record.raw.get("finishedAt") or record.updated_at_ms
    return not isinstance(at, int) or at < bound


def _changed(outcome: DispatchOutcome) -> bool:
    return bool(
        outcome.enqueued or outcome.cancelled or outcome.failed or outcome.counted
        or outcome.closed
    )  # fmt: skip


def _summary(outcome: DispatchOutcome) -> str:
    parts: Iterable[tuple[str, list[str]]] = (
        ("enqueued", outcome.enqueued),
        ("cancelled", outcome.cancelled),
        ("failed", outcome.failed),
        ("counted", outcome.counted),
    )
    said = [f"{name} {len(keys_)}" for name, keys_ in parts if keys_]
    if outcome.closed:
        said.append(f"closed {outcome.closed}")
    return ", ".join(said)
