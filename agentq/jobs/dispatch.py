"""The job dispatcher: from a terminal task event to the job's next step.

An event is only a trigger: each call reconciles the job from the table (the job item
and every task's STATE item, strongly consistent), so duplicate, late or reordered
events are harmless. It applies the failure policy, moves each ready BLOCKED task to
PENDING conditionally (recording the trigger, `enqueuedBy`) and sends it only when its
own transition succeeded, then counts and closes (agentq.jobs.store). The steps and
their fault stories are in docs/jobs.md ("What happens when").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agentq.envelope import TaskEnvelope
from agentq.errors import AgentqError, InvalidInput, NotFound
from agentq.events import Event, job_event, now_ms, task_event
from agentq.jobs import refs
from agentq.jobs.policy import NOT_STARTED, doomed_tasks
from agentq.jobs.refs import Ref
from agentq.jobs.results import ReferencedResults, ResultReader
from agentq.jobs.spec import JobSpec, TaskSpec, task_request_id
from agentq.jobs.store import JobRecord, JobState, JobStore
from agentq.jobs.submitter import TaskSubmitter
from agentq.jobs.task_states import read_task_states
from agentq.publisher import EventPublisher
from agentq.security import sanitize_error_message
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore

logger = logging.getLogger(__name__)


@dataclass
class DispatchOutcome:
    job_id: str
    enqueued: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    counted: list[str] = field(default_factory=list)
    closed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "enqueued": self.enqueued,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "counted": self.counted,
            "closed": self.closed,
        }


class JobDispatcher:
    def __init__(
        self,
        *,
        jobs: JobStore,
        tasks: TaskStore,
        submitter: TaskSubmitter,
        results: ResultReader,
        publisher: EventPublisher,
        dynamodb: Any,
        table_name: str,
    ) -> None:
        self._jobs = jobs
        self._tasks = tasks
        self._submitter = submitter
        self._results = results
        self._publisher = publisher
        self._ddb = dynamodb
        self._table = table_name

    def on_task_event(self, event: Event) -> DispatchOutcome:
        if not event.job_id:
            raise InvalidInput("jobId", "the dispatcher only handles events of job tasks")
        return self.reconcile(event.tenant, event.job_id, trigger=event.event_id)

    def reconcile(self, tenant: str, job_id: str, *, trigger: str) -> DispatchOutcome:
        """Bring the job forward from its stored state; safe to repeat with any trigger."""
        outcome = DispatchOutcome(job_id=job_id)
        job = self._jobs.get(tenant, job_id)
        if job is None:
            raise NotFound("job", job_id)
        spec = job.spec
        states = self.task_states(tenant, job_id, spec.keys)
        self._resend_own_endings(states, trigger)
        # Each pass can unlock the next (a cancellation cascades, a failed resolution
        # fails a task); a DAG of n tasks settles within n passes.
        for _ in range(len(spec.tasks) + 1):
            changed = self._apply_policy(job, states, trigger, outcome)
            changed |= self._enqueue_ready(job, states, trigger, outcome)
            if not changed:
                break
        self._count_and_close(job, states, trigger, outcome)
        return outcome

    def _resend_own_endings(self, states: Mapping[str, TaskRecord | None], trigger: str) -> None:
        """A retry of an invocation that ended tasks (a cancel by policy, an input that
        cannot be built) and stopped before their events went out (PutEvents failed, the
        Lambda died): each ending is stored on its STATE item; send it again, same id,
        which save-event and this dispatcher deduplicate."""
        for record in states.values():
            if record is None or not record.state.terminal:
                continue
            if trigger not in (record.raw.get("cancelledBy"), record.raw.get("failedBy")):
                continue
            stored = record.raw.get("terminalEvent")
            if isinstance(stored, Mapping):
                self._publisher.publish(Event.from_detail(stored))

    # -- failure policy (agentq.jobs.policy decides) ---------------------------------
    def _apply_policy(
        self,
        job: JobRecord,
        states: dict[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> bool:
        changed = False
        for key, reason in doomed_tasks(job.spec, states).items():
            changed |= self._cancel(job, key, reason, states, trigger, outcome)
        return changed

    def _cancel(
        self,
        job: JobRecord,
        key: str,
        reason: str,
        states: dict[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> bool:
        request_id = task_request_id(job.job_id, key)
        before = states.get(key)
        event = task_event(
            "Task Cancelled",
            request_id=request_id,
            tenant=job.tenant,
            job_id=job.job_id,
            definition=before.definition if before is not None else None,
            reason=reason,
            task_key=key,
        )
        # Stored with the transition, published after it (see _resend_own_endings).
        moved = self._tasks.transition(
            job.tenant,
            request_id,
            from_states=NOT_STARTED,
            to_state=TaskState.CANCELLED,
            fields={"cancelReason": reason, "cancelledBy": trigger,
                    "terminalEvent": event.to_detail()},
        )  # fmt: skip
        if moved is None:
            states[key] = self._tasks.get(job.tenant, request_id)
            return False
        states[key] = moved
        outcome.cancelled.append(key)
        self._publisher.publish(event)
        return True

    # -- readiness ----------------------------------------------------------------------
    def _enqueue_ready(
        self,
        job: JobRecord,
        states: dict[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> bool:
        changed = False
        failed_before = len(outcome.failed)
        ready: list[TaskEnvelope] = []
        for task in job.spec.tasks:
            record = states.get(task.key)
            if record is None:
                continue
            if record.state is TaskState.BLOCKED and all(
                (dep := states.get(d)) is not None and dep.state is TaskState.COMPLETED
                for d in task.depends_on
            ):
                moved = self._move_to_pending(job, task, states, trigger, outcome)
                if moved is not None:
                    ready.append(moved)
                    changed = True
            elif (
                task.key not in outcome.enqueued
                and record.state in (TaskState.PENDING, TaskState.SCHEDULED)
                and record.raw.get("enqueuedBy") == trigger
                and TaskSubmitter.interrupted(record)
            ):
                # This very trigger moved it and then stopped before sending: finish.
                envelope = TaskEnvelope.from_dict(record.envelope or {}, default_tenant=job.tenant)
                ready.append(envelope)
                outcome.enqueued.append(task.key)
        self._submitter.enqueue_many(ready)
        # A task that failed to resolve its input is a failure the policy must see.
        return changed or len(outcome.failed) > failed_before

    def _move_to_pending(
        self,
        job: JobRecord,
        task: TaskSpec,
        states: dict[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> TaskEnvelope | None:
        """BLOCKED → PENDING with the resolved envelope; the envelope if this call moved it."""
        request_id = task_request_id(job.job_id, task.key)
        try:
            envelope = TaskEnvelope(
                request_id=request_id,
                tenant=job.tenant,
                definition=task.definition,
                input=self.resolve_input(job.spec, task, states),
                job_id=job.job_id,
                task_key=task.key,
                submitted_at_ms=now_ms(),
                not_before_ms=task.not_before_ms,
                # Resolved when the task was created (task, job, definition).
                priority=_stored_priority(states.get(task.key)),
                continues=(task_request_id(job.job_id, task.continues) if task.continues else None),
                prompt=task.prompt,
                resume=task.resume,
            )
            envelope.to_body()  # the size check, before the state moves
        except (InvalidInput, NotFound) as error:
            self._fail_unresolvable(job, task, error, states, trigger, outcome)
            return None
        delayed = task.not_before_ms is not None and task.not_before_ms > now_ms()
        moved = self._tasks.transition(
            job.tenant,
            request_id,
            from_states=[TaskState.BLOCKED],
            # A task with a time of its own waits SCHEDULED (its message delayed) till then.
            to_state=TaskState.SCHEDULED if delayed else TaskState.PENDING,
            fields={"envelope": envelope.to_dict(), "enqueuedBy": trigger,
                    **({"notBefore": task.not_before_ms} if delayed else {})},
            due_ms=task.not_before_ms if delayed else None,
        )  # fmt: skip
        if moved is None:
            # Another invocation got there first; it sends the message, not us.
            states[task.key] = self._tasks.get(job.tenant, request_id)
            return None
        states[task.key] = moved
        outcome.enqueued.append(task.key)
        return envelope

    def resolve_input(
        self, spec: JobSpec, task: TaskSpec, states: Mapping[str, TaskRecord | None]
    ) -> dict[str, Any]:
        groups = spec.groups
        results = ReferencedResults(self._results, f"tasks.{task.key}.input")

        def result_of(key: str) -> Any:
            record = states.get(key)
            if record is None or record.state is not TaskState.COMPLETED:
                raise InvalidInput(f"tasks.{task.key}.input", f"task {key} has no result")
            return results.of(record)

        def lookup(ref: Ref, where: str) -> Any:
            if ref.kind == "task":
                return refs.select(result_of(ref.name), ref.path, where)
            if ref.kind == "group":
                return [result_of(key) for key in groups.get(ref.name, [])]
            raise InvalidInput(where, f"{ref} cannot be resolved here")

        resolved = refs.substitute(dict(task.input), f"tasks.{task.key}.input", lookup)
        return dict(refs.unescape(resolved))

    def _fail_unresolvable(
        self,
        job: JobRecord,
        task: TaskSpec,
        error: AgentqError,
        states: dict[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> bool:
        request_id = task_request_id(job.job_id, task.key)
        category = "not_found" if isinstance(error, NotFound) else "validation"
        message = sanitize_error_message(f"cannot build the task's input: {error}")
        error_record = {"category": category, "retryable": False, "message": message}
        event = task_event("Task Failed", request_id=request_id, tenant=job.tenant,
                           job_id=job.job_id, definition=task.definition, error=error_record,
                           task_key=task.key)  # fmt: skip
        # A task that can never get its input fails where it stands (BLOCKED), so the
        # failure policy and the job's close see it like any other failure.
        moved = self._tasks.transition(
            job.tenant,
            request_id,
            from_states=[TaskState.BLOCKED],
            to_state=TaskState.FAILED,
            fields={"error": error_record, "failedBy": trigger,
                    "terminalEvent": event.to_detail()},
        )  # fmt: skip
        if moved is None:
            states[task.key] = self._tasks.get(job.tenant, request_id)
            return False
        states[task.key] = moved
        outcome.failed.append(task.key)
        self._publisher.publish(event)
        return True

    # -- counting and closing ----------------------------------------------------------
    def _count_and_close(
        self,
        job: JobRecord,
        states: Mapping[str, TaskRecord | None],
        trigger: str,
        outcome: DispatchOutcome,
    ) -> None:
        stale = False
        for key, record in states.items():
            if record is None or not record.state.terminal or key in job.counted:
                continue
            counted = self._jobs.count(
                job.tenant, job.job_id, key, record.state, cost_usd=_cost(record)
            )
            if counted is not None:
                job = counted
                outcome.counted.append(key)
            # Counted already (elsewhere, or ours applied then retried): `job` predates it.
            stale = stale or counted is None
        if stale:
            job = self._jobs.get(job.tenant, job.job_id) or job
        if job.state != "RUNNING":
            if job.closed_by == trigger and not job.raw.get("closePublished"):
                self._publish_close(job)  # a retry of the invocation that closed it
            return
        if not job.finished:
            return
        final: JobState = "COMPLETED" if job.counts.get("completed", 0) == job.total else "FAILED"
        closed = self._jobs.close(job.tenant, job.job_id, final, closed_by=trigger)
        if closed is None:
            latest = self._jobs.get(job.tenant, job.job_id)
            if latest is None or latest.closed_by != trigger or latest.raw.get("closePublished"):
                return
            closed = latest
        outcome.closed = closed.state
        self._publish_close(closed)

    def _publish_close(self, job: JobRecord) -> None:
        kind: Any = "Job Completed" if job.state == "COMPLETED" else "Job Failed"
        summary = {k: v for k, v in job.to_dict().items() if k not in ("jobId", "tenant")}
        event = job_event(kind, job_id=job.job_id, tenant=job.tenant, **summary)
        # A re-published close keeps its id and time, so the events table stores it once.
        self._publisher.publish(
            replace(
                event,
                event_id=f"job-closed-{job.job_id}",
                timestamp_ms=int(job.closed_at_ms or event.timestamp_ms),
            )
        )
        self._jobs.mark_close_published(job.tenant, job.job_id)

    # -- reading ----------------------------------------------------------------------------
    def task_states(
        self, tenant: str, job_id: str, task_keys: Iterable[str]
    ) -> dict[str, TaskRecord | None]:
        """Every task's STATE item, strongly consistent (never the byJob index)."""
        return read_task_states(self._ddb, self._table, tenant, job_id, task_keys)


def _cost(record: TaskRecord) -> float:
    for name in ("costUsd", "cost_usd"):
        value = record.raw.get(name)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def _stored_priority(record: TaskRecord | None) -> str | None:
    priority = (record.envelope or {}).get("priority") if record is not None else None
    return priority if isinstance(priority, str) else None
