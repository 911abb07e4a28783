"""Creating jobs and adding tasks to them, a part of `AgentqClient`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from agentq.client.parts import ClientParts
from agentq.envelope import TaskEnvelope
from agentq.errors import InvalidInput
from agentq.events import now_ms
from agentq.jobs import JobRecord, JobSpec, check_definitions, parse_spec, task_request_id
from agentq.jobs.spec import check_item_size, check_not_before, validate_job_id
from agentq.priority import check_spec_priorities, resolve_priority
from agentq.states import TaskState


class JobCreation:
    """Job creation: the part of `AgentqClient` that creates jobs and adds tasks."""

    def __init__(self, parts: ClientParts) -> None:
        self._parts = parts

    def create_job(
        self,
        spec: Mapping[str, Any] | JobSpec,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
    ) -> JobRecord:
        """Validate the spec (nothing is written if it is bad), then create and start it.

        Re-running with the same `job_id` finishes an interrupted creation and changes
        nothing else.
        """
        raw = spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)
        tenant = tenant or raw.pop("tenant", None) or self._parts.settings.tenant_id
        job_id = validate_job_id(job_id or raw.pop("job_id", None) or uuid.uuid4().hex)
        raw.pop("tenant", None)
        raw.pop("job_id", None)
        parsed = parse_spec(raw)
        check_item_size(parsed)
        check_not_before(parsed.tasks, now_ms())
        check_spec_priorities(self._parts.settings, parsed)
        for task in parsed.tasks:
            task_request_id(job_id, task.key)
        if self._parts.definitions is not None:
            check_definitions(parsed.tasks, self._parts.definitions.get)
        self._parts.check_continuations(tenant, parsed.tasks)
        job, created = self._parts.jobs.create(tenant, job_id, parsed)
        if not created and job.spec != parsed:
            raise InvalidInput("jobId", f"job {job_id} already exists with a different spec")
        self._create_tasks(job, parsed)
        self._parts.dispatcher.reconcile(tenant, job_id, trigger=f"create-{job_id}")
        return self._parts.jobs.require(tenant, job_id)

    def add_tasks(
        self,
        job_id: str,
        tasks: Mapping[str, Any],
        *,
        tenant: str | None = None,
        tolerate_existing: bool = False,
    ) -> JobRecord:
        """Add tasks to a running job; they may depend on its existing tasks."""
        tenant = tenant or self._parts.settings.tenant_id
        job = self._parts.jobs.require(tenant, job_id)
        if tolerate_existing:
            tasks = {k: v for k, v in tasks.items() if k not in job.spec.keys}
        if tasks:
            extended = parse_spec({"tasks": tasks}, existing=job.spec)
            check_item_size(extended)  # the extended spec replaces the stored one
            added = [t for t in extended.tasks if t.key not in job.spec.keys]
            check_not_before(added, now_ms())
            check_spec_priorities(self._parts.settings, extended)
            for task in added:
                task_request_id(job_id, task.key)
            if self._parts.definitions is not None:
                check_definitions(added, self._parts.definitions.get)
            self._parts.check_continuations(tenant, added)
            job = self._parts.jobs.add_tasks(job, extended)
            self._create_tasks(job, extended)
        self._parts.dispatcher.reconcile(tenant, job_id, trigger=f"add-{uuid.uuid4().hex}")
        return self._parts.jobs.require(tenant, job_id)

    def _create_tasks(self, job: JobRecord, spec: JobSpec) -> None:
        # Every task starts BLOCKED; the reconcile that follows enqueues the ready ones
        # through the same conditional BLOCKED → PENDING as the dispatcher. Tasks that
        # exist already (an interrupted creation being finished) are left alone.
        existing = self._parts.dispatcher.task_states(job.tenant, job.job_id, spec.keys)
        for task in spec.tasks:
            if existing.get(task.key) is not None:
                continue
            envelope = TaskEnvelope(
                request_id=task_request_id(job.job_id, task.key),
                tenant=job.tenant,
                definition=task.definition,
                input=task.input,
                job_id=job.job_id,
                task_key=task.key,
                priority=resolve_priority(
                    self._parts.settings,
                    task.priority or spec.priority,
                    self._parts.check_definition(task.definition, f"tasks.{task.key}.definition"),
                ),
                resume=task.resume,
            )
            self._parts.tasks.create(envelope, state=TaskState.BLOCKED, extra={"taskKey": task.key})
