"""The producer client: submit tasks, create jobs, read them back, wait, cancel.

    client = AgentqClient.from_env()
    task = client.submit("summarize", {"document": "..."}, idempotency_key="doc-42")
    job = client.create_job(load_spec_file(Path("report.yaml")))
    final = client.wait(job_id=job.job_id, timeout_s=600)

boto3 clients are passed in (or built by `from_env` from `Settings`); nothing talks
to AWS at import. Every wait is bounded.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from agentq.aws import AwsClients
from agentq.config import Settings
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import TaskEnvelope, validate_request_id
from agentq.errors import AgentqError, InvalidInput, NotCancellable, NotFound
from agentq.events import REJECTED_REASON, Event, now_ms
from agentq.jobs import (
    JobDispatcher,
    JobRecord,
    JobSpec,
    JobStore,
    ResultReader,
    TaskSubmitter,
    check_definitions,
    parse_spec,
    request_id_for,
    task_request_id,
)
from agentq.jobs.spec import validate_job_id
from agentq.priority import check_priority, check_spec_priorities, resolve_priority
from agentq.prompts import check_prompt_inputs
from agentq.publisher import EventPublisher
from agentq.schedule import resolve_not_before
from agentq.states import TaskState
from agentq.store import EventStore, TaskRecord, TaskStore
from agentq.store.scheduling import NOT_STARTED, request_cancel
from agentq.task_outputs import TaskOutputs


class WaitTimeout(AgentqError):
    """`wait` gave up; the task or job is still running (`state` says where it is)."""

    def __init__(self, what: str, state: str, timeout_s: float) -> None:
        self.what = what
        self.state = state
        self.timeout_s = timeout_s
        super().__init__(f"{what} still {state} after {timeout_s:g}s")


class AgentqClient:
    def __init__(
        self,
        *,
        settings: Settings,
        sqs: Any,
        dynamodb: Any,
        events: Any,
        s3: Any,
        definitions: DefinitionRegistry | None = None,
    ) -> None:
        settings.require("table_name", "bus_name", "bucket")
        self.settings = settings
        table = settings.required("table_name")
        self.tasks = TaskStore(dynamodb, table)
        self.jobs = JobStore(dynamodb, table)
        self.event_store = EventStore(dynamodb, table, app_name=settings.app_name)
        self.publisher = EventPublisher(
            events,
            bus_name=settings.required("bus_name"),
            source=settings.app_name,
            s3_client=s3,
            bucket=settings.bucket,
        )
        self.results = ResultReader(s3, settings.required("bucket"))
        self.outputs = TaskOutputs(s3, self.results)
        self.definitions = definitions
        self.dynamodb = dynamodb
        self._sqs = sqs
        self._ddb = dynamodb
        self._table = table

    @classmethod
    def from_env(
        cls, settings: Settings | None = None, *, aws: AwsClients | None = None
    ) -> AgentqClient:
        settings = settings or Settings.from_env()
        aws = aws or AwsClients(settings.region)
        return cls(
            settings=settings,
            sqs=aws.sqs,
            dynamodb=aws.dynamodb,
            events=aws.events,
            s3=aws.s3,
            definitions=default_registry(settings, aws.dynamodb),
        )

    # -- parts other components reuse -----------------------------------------------
    @property
    def submitter(self) -> TaskSubmitter:
        return TaskSubmitter(
            tasks=self.tasks,
            publisher=self.publisher,
            sqs=self._sqs,
            queue_url=self.settings.required("queue_url"),
            dynamodb=self._ddb,
            table_name=self._table,
            max_message_delay_s=self.settings.max_message_delay_s,
            tier_urls=self.settings.tier_queue_urls(),
        )

    @property
    def dispatcher(self) -> JobDispatcher:
        return JobDispatcher(
            jobs=self.jobs,
            tasks=self.tasks,
            submitter=self.submitter,
            results=self.results,
            publisher=self.publisher,
            dynamodb=self._ddb,
            table_name=self._table,
        )

    # -- submitting -------------------------------------------------------------------
    def submit(
        self,
        definition: str,
        input: Mapping[str, Any] | None = None,
        *,
        job_id: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
        delay: float | None = None,
        not_before: str | float | None = None,
        priority: str | None = None,
    ) -> TaskRecord:
        """Queue one task. The same idempotency key twice returns the existing task.

        With `job_id`, the task joins that (running) job as a root task. `delay`
        (seconds) or `not_before` (ISO time or epoch, agentq.schedule) hold it SCHEDULED
        until then. `priority` is a tier of PRIORITIES; without it the definition's, else
        DEFAULT_PRIORITY.
        """
        tenant = tenant or self.settings.tenant_id
        check_priority(self.settings, priority, "priority")
        submitted = now_ms()
        due = resolve_not_before(delay_s=delay, not_before=not_before, now_ms=submitted)
        if due is not None and job_id is not None:
            raise InvalidInput("delay", "a job task is delayed by its job spec's not_before")
        found = self._check_definition(definition, "definition")
        if found is not None and job_id is None:
            check_prompt_inputs(found, input or {})
        if job_id is not None:
            # The key, like a request id, is derived from the idempotency key if any.
            key = "t-" + request_id_for(tenant, idempotency_key).removeprefix("idem-")[:16]
            task: dict[str, Any] = {"definition": definition, "input": dict(input or {})}
            if priority:
                task["priority"] = priority
            job = self.add_tasks(job_id, {key: task}, tenant=tenant, tolerate_existing=True)
            return self.tasks.require(tenant, task_request_id(job.job_id, key))
        envelope = TaskEnvelope(
            request_id=request_id_for(tenant, idempotency_key),
            tenant=tenant,
            definition=definition,
            input=dict(input or {}),
            submitted_at_ms=submitted,
            not_before_ms=due,
            priority=resolve_priority(self.settings, priority, found),
        )
        record, _ = self.submitter.submit(envelope, idempotency_key=idempotency_key)
        return record

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
        tenant = tenant or raw.pop("tenant", None) or self.settings.tenant_id
        job_id = validate_job_id(job_id or raw.pop("job_id", None) or uuid.uuid4().hex)
        raw.pop("tenant", None)
        raw.pop("job_id", None)
        parsed = parse_spec(raw)
        check_spec_priorities(self.settings, parsed)
        for task in parsed.tasks:
            task_request_id(job_id, task.key)
        if self.definitions is not None:
            check_definitions(parsed.tasks, self.definitions.get)
        job, created = self.jobs.create(tenant, job_id, parsed)
        if not created and job.spec != parsed:
            raise InvalidInput("jobId", f"job {job_id} already exists with a different spec")
        self._create_tasks(job, parsed)
        self.dispatcher.reconcile(tenant, job_id, trigger=f"create-{job_id}")
        return self.jobs.require(tenant, job_id)

    def add_tasks(
        self,
        job_id: str,
        tasks: Mapping[str, Any],
        *,
        tenant: str | None = None,
        tolerate_existing: bool = False,
    ) -> JobRecord:
        """Add tasks to a running job; they may depend on its existing tasks."""
        tenant = tenant or self.settings.tenant_id
        job = self.jobs.require(tenant, job_id)
        if tolerate_existing:
            tasks = {k: v for k, v in tasks.items() if k not in job.spec.keys}
        if tasks:
            extended = parse_spec({"tasks": tasks}, existing=job.spec)
            added = [t for t in extended.tasks if t.key not in job.spec.keys]
            check_spec_priorities(self.settings, extended)
            for task in added:
                task_request_id(job_id, task.key)
            if self.definitions is not None:
                check_definitions(added, self.definitions.get)
            job = self.jobs.add_tasks(job, extended)
            self._create_tasks(job, extended)
        self.dispatcher.reconcile(tenant, job_id, trigger=f"add-{uuid.uuid4().hex}")
        return self.jobs.require(tenant, job_id)

    def _create_tasks(self, job: JobRecord, spec: JobSpec) -> None:
        # Every task starts BLOCKED; the reconcile that follows enqueues the ready ones
        # through the same conditional BLOCKED → PENDING as the dispatcher. Tasks that
        # exist already (an interrupted creation being finished) are left alone.
        existing = self.dispatcher.task_states(job.tenant, job.job_id, spec.keys)
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
                    self.settings,
                    task.priority or spec.priority,
                    self._check_definition(task.definition, f"tasks.{task.key}.definition"),
                ),
            )
            self.tasks.create(envelope, state=TaskState.BLOCKED, extra={"taskKey": task.key})

    # -- reading ----------------------------------------------------------------------
    def get_task(self, request_id: str, *, tenant: str | None = None) -> TaskRecord:
        """The task's STATE item; for a message the worker rejected, its `Task Failed`.

        A rejected message never becomes a task: it has no valid envelope to store, and
        a STATE item written from it would let a malformed message claim a request id
        before the real task arrives. Its stored `Task Failed` event answers instead,
        and only while no STATE item exists for the id.
        """
        validate_request_id(request_id)
        tenant = tenant or self.settings.tenant_id
        record = self.tasks.get(tenant, request_id)
        if record is None:
            record = rejected_record(self.event_store.timeline(tenant, request_id))
        if record is None:
            raise NotFound("task", request_id)
        return record

    def get_job(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        return self.jobs.require(tenant or self.settings.tenant_id, validate_job_id(job_id))

    def job_tasks(self, job: JobRecord) -> dict[str, TaskRecord | None]:
        """Each task of the job by key, read strongly consistent (None: not created yet)."""
        return self.dispatcher.task_states(job.tenant, job.job_id, job.spec.keys)

    def list_jobs(self, *, tenant: str | None = None, limit: int = 50) -> list[JobRecord]:
        return self.jobs.list(tenant or self.settings.tenant_id, limit=limit)

    def recent_tasks(
        self, *, since_ms: int, tenant: str | None = None, limit: int = 20
    ) -> list[TaskRecord]:
        """Tasks submitted on their own (not in a job) since `since_ms`, newest first.

        Found through the tenant's stored `Task Pending` events (the byTenant index), then
        read from their STATE items, which hold the state.
        """
        tenant = tenant or self.settings.tenant_id
        found: dict[str, None] = {}
        for event in reversed(self.event_store.tenant_events(tenant, since_ms=since_ms)):
            if event.get("detailType") == "Task Pending" and not event.get("jobId"):
                found.setdefault(str(event.get("requestId")))
        records = (self.tasks.get(tenant, request_id) for request_id in list(found)[:limit])
        return [record for record in records if record is not None]

    def events(self, request_id: str, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """A task's stored events, oldest first."""
        validate_request_id(request_id)
        return self.event_store.timeline(tenant or self.settings.tenant_id, request_id)

    def result(self, request_id: str, *, tenant: str | None = None) -> Any:
        """The result the STATE item names: the winning attempt's, in the task's tenant."""
        record = self.get_task(request_id, tenant=tenant)
        if record.state is not TaskState.COMPLETED:
            raise InvalidInput("requestId", f"task {request_id} is {record.state.value}, no result")
        return self.results.load(record)

    # -- a task's stored outputs (S3) -------------------------------------------------------
    def logs(self, request_id: str, *, tenant: str | None = None) -> dict[str, str]:
        """A task's log files (`logs/…`, and `error.json` if it failed) by name, as text."""
        return self.outputs.logs(self.get_task(request_id, tenant=tenant))

    def trace(self, request_id: str, *, tenant: str | None = None) -> Any:
        """An agent task's session trace (what the agent did, step by step), parsed."""
        return self.outputs.trace(self.get_task(request_id, tenant=tenant))

    def artifacts(self, request_id: str, *, tenant: str | None = None) -> dict[str, str]:
        """The files (logs, traces, artifacts) of the attempt the STATE item names:
        name within the attempt's folder → S3 key (empty before any attempt settled)."""
        return self.results.files(self.get_task(request_id, tenant=tenant))

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
                current = self.get_job(job_id, tenant=tenant)
                done, state = current.state != "RUNNING", current.state
            else:
                assert request_id is not None
                current = self.get_task(request_id, tenant=tenant)
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
    ) -> list[str]:
        """Cancel a task, or every task of a job that has not started.

        A task not started is CANCELLED at once; a running one is asked to stop (its
        worker stops the child within one heartbeat and records `Task Cancelled`).
        Returns the request ids cancelled or asked to stop now; cancelling one finished
        task raises `NotCancellable`. A job task's cancellation applies the job's
        failure policy, and a job whose tasks are all terminal is closed.
        """
        if (request_id is None) == (job_id is None):
            raise InvalidInput("cancel", "give exactly one of request_id or job_id")
        tenant = tenant or self.settings.tenant_id
        if job_id is not None:
            job = self.get_job(job_id, tenant=tenant)
            targets = [
                record
                for record in self.job_tasks(job).values()
                if record is not None and record.state in NOT_STARTED
            ]
        else:
            assert request_id is not None
            targets = [self.get_task(request_id, tenant=tenant)]
        done: list[str] = []
        for record in targets:
            try:
                result = request_cancel(self.tasks, self._ddb, self._table, record, reason)
            except NotCancellable:
                if job_id is not None:
                    continue  # finished meanwhile: nothing to do for a job-wide cancel
                raise
            done.append(record.request_id)
            if result.outcome == "cancelled":
                stored = result.record.raw.get("terminalEvent")
                if isinstance(stored, Mapping):
                    self.publisher.publish(Event.from_detail(stored))
        for affected in {r.job_id for r in targets if r.job_id}:
            self.dispatcher.reconcile(tenant, affected, trigger=f"cancel-{uuid.uuid4().hex}")
        return done

    def _check_definition(self, name: str, field: str) -> TaskDefinition | None:
        if self.definitions is None:
            return None
        try:
            return self.definitions.get(name)
        except NotFound:
            raise InvalidInput(field, f"unknown task definition {name!r}") from None


def default_registry(settings: Settings, dynamodb: Any) -> DefinitionRegistry | None:
    """Definitions from the table and/or directories the settings name (None: no checks)."""
    if not settings.definitions_table and not settings.definitions_dir:
        return None
    # Producers validate against what is stored now: no cache.
    return DefinitionRegistry.from_settings(settings, dynamodb, cache_seconds=0)


def rejected_record(timeline: list[dict[str, Any]]) -> TaskRecord | None:
    """A FAILED record from the `Task Failed` the worker stored for a rejected message."""
    for event in reversed(timeline):
        payload = event.get("payload") or {}
        if event.get("detailType") != "Task Failed" or payload.get("reason") != REJECTED_REASON:
            continue
        at = event.get("timestampMs")
        at_ms = at if isinstance(at, int) else None
        raw = {"requestId": event["requestId"], "tenant": event["tenant"],
               "state": TaskState.FAILED.value, "attempt": 0, "rejected": True,
               "error": payload.get("error"), "terminalEvent": event, "finishedAt": at_ms}  # fmt: skip
        return TaskRecord(
            request_id=str(event["requestId"]), tenant=str(event["tenant"]),
            state=TaskState.FAILED, attempt=0, definition=None, job_id=None, owner=None,
            lease_token=None, effective_until_ms=None, created_at_ms=at_ms,
            updated_at_ms=at_ms, raw=raw,
        )  # fmt: skip
    return None
