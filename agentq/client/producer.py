"""The producer client: submit tasks, create jobs, read them back, wait, cancel.

    client = AgentqClient.from_env()
    task = client.submit("summarize", {"document": "..."}, idempotency_key="doc-42")
    job = client.create_job(load_spec_file(Path("report.yaml")))
    final = client.wait(job_id=job.job_id, timeout_s=600)

boto3 clients are passed in (or built by `from_env` from `Settings`); nothing talks
to AWS at import. Every wait is bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.aws import AwsClients
from agentq.client.control import TaskControl
from agentq.client.jobs import JobCreation
from agentq.client.parts import ClientParts, rejected_record
from agentq.config import Settings
from agentq.continuation import check_continuable
from agentq.conversation import Conversation
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import TaskEnvelope, validate_request_id
from agentq.errors import InvalidInput, NotFound
from agentq.events import now_ms, standalone_request_id
from agentq.jobs import (
    JobDispatcher,
    JobRecord,
    TaskSubmitter,
    request_id_for,
    task_request_id,
)
from agentq.priority import check_priority, resolve_priority
from agentq.prompts import check_prompt_inputs
from agentq.resume import check_override, override_of, resumes
from agentq.schedule import resolve_not_before
from agentq.states import TaskState
from agentq.store import TaskRecord

__all__ = ["AgentqClient", "default_registry"]


class AgentqClient:
    """The producer client, composed of its parts: `ClientParts` (stores, wiring and
    reading one task or job), `JobCreation` (creating jobs) and `TaskControl` (wait,
    cancel); submitting is its own.
    """

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
        parts = ClientParts(
            settings=settings, sqs=sqs, dynamodb=dynamodb, events=events, s3=s3,
            definitions=definitions,
        )  # fmt: skip
        self._parts = parts
        self.settings = parts.settings
        self.tasks = parts.tasks
        self.jobs = parts.jobs
        self.event_store = parts.event_store
        self.publisher = parts.publisher
        self.results = parts.results
        self.outputs = parts.outputs
        self.definitions = parts.definitions
        self.dynamodb = parts.dynamodb
        self.get_task = parts.get_task
        self.get_job = parts.get_job
        self.job_tasks = parts.job_tasks
        creation = JobCreation(parts)
        self.create_job = creation.create_job
        self.add_tasks = creation.add_tasks
        control = TaskControl(parts)
        self.wait = control.wait
        self.cancel = control.cancel
        self.retry = control.retry

    @property
    def submitter(self) -> TaskSubmitter:
        return self._parts.submitter

    @property
    def dispatcher(self) -> JobDispatcher:
        return self._parts.dispatcher

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
        continues: str | None = None,
        prompt: str | None = None,
        resume: bool | None = None,
    ) -> TaskRecord:
        """Queue one task. The same idempotency key twice returns the existing task.

        With `job_id`, the task joins that (running) job as a root task. `delay`
        (seconds) or `not_before` (ISO time or epoch, agentq.schedule) hold it SCHEDULED
        until then. `priority` is a tier of PRIORITIES; without it the definition's, else
        DEFAULT_PRIORITY. With `continues` (a COMPLETED agent task of the same tenant that ran
        with resume on) the agent session starts from that task's final one
        and `prompt`, the follow-up, is its next user turn (docs/agent-tasks.md). `resume`
        (True/False) turns resume on retry on or off for this agent task alone, over its
        definition's `resume`.
        """
        tenant = tenant or self.settings.tenant_id
        check_priority(self.settings, priority, "priority")
        submitted = now_ms()
        due = resolve_not_before(delay_s=delay, not_before=not_before, now_ms=submitted)
        if due is not None and job_id is not None:
            raise InvalidInput("delay", "a job task is delayed by its job spec's not_before")
        found = self._parts.check_definition(definition, "definition")
        check_override(found, resume, "resume")
        if continues is not None and job_id is not None:
            raise InvalidInput("continues", "a job task continues another by its spec's continues")
        if found is not None and job_id is None and continues is None and prompt is None:
            # A continuation's prompt is its follow-up: the definition's is not rendered.
            check_prompt_inputs(found, input or {})
        if job_id is not None:
            # The key, like a request id, is derived from the idempotency key if any.
            key = "t-" + request_id_for(tenant, idempotency_key).removeprefix("idem-")[:16]
            task: dict[str, Any] = {"definition": definition, "input": dict(input or {})}
            if priority:
                task["priority"] = priority
            if resume is not None:
                task["resume"] = resume
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
            continues=continues,
            prompt=prompt,
            resume=resume,
        )
        if continues is not None:
            # Read under this tenant: another tenant's task of that id is not found.
            check_continuable(self.tasks.get(tenant, continues), continues, definition=found,
                              transcripts=self.transcripts(tenant))  # fmt: skip
        record, _ = self.submitter.submit(envelope, idempotency_key=idempotency_key)
        return record

    # -- reading ----------------------------------------------------------------------
    def list_jobs(self, *, tenant: str | None = None, limit: int = 50) -> list[JobRecord]:
        return self.jobs.list(tenant or self.settings.tenant_id, limit=limit)

    def recent_tasks(
        self, *, since_ms: int, tenant: str | None = None, limit: int = 20
    ) -> list[TaskRecord]:
        """Tasks on their own (not in a job) with events since `since_ms`, newest first,
        from every producer path (agentq's, the bus, raw SQS messages).

        Found through the tenant's stored task events (the byTenant index), then read
        from their STATE items, which hold the state; a message the worker rejected has
        none, and its `Task Failed` stands for it.
        """
        tenant = tenant or self.settings.tenant_id
        found: dict[str, dict[str, Any]] = {}
        for event in reversed(self.event_store.tenant_events(tenant, since_ms=since_ms)):
            request_id = standalone_request_id(event)
            if request_id is not None:
                found.setdefault(request_id, event)
        records = []
        for request_id, event in list(found.items())[:limit]:
            record = self.tasks.get(tenant, request_id) or rejected_record([event])
            if record is not None:
                records.append(record)
        return records

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

    def conversation(self, request_id: str, *, tenant: str | None = None) -> Conversation:
        """An agent task's conversation (prompt, messages, tool calls and results) across
        its attempts, from its session checkpoints; `note` says why there is none."""
        record = self.get_task(request_id, tenant=tenant)
        definition = self._definition(record)
        if definition is not None and definition.kind != "agent":
            return Conversation(note=f"no conversation (a {definition.kind} task)")
        resume_on = (
            None
            if definition is None
            else resumes(definition.kind, definition.settings, override_of(record.envelope))
        )
        return self.outputs.conversation(record, transcripts=self.transcripts(record.tenant),
                                         resume_on=resume_on)  # fmt: skip

    def transcripts(self, tenant: str) -> bool | None:
        """Whether the tenant stores agent transcripts; None when these credentials may not
        read tenant settings (a producer's may not: the operator's may)."""
        return self._parts.transcripts(tenant)

    def _definition(self, record: TaskRecord) -> TaskDefinition | None:
        """The task's definition as known here now (None: unknown)."""
        if self.definitions is None or record.definition is None:
            return None
        try:
            return self.definitions.get(record.definition)
        except NotFound:
            return None

    def artifacts(self, request_id: str, *, tenant: str | None = None) -> dict[str, str]:
        """The files (logs, traces, artifacts) of the attempt the STATE item names:
        name within the attempt's folder → S3 key (empty before any attempt settled)."""
        return self.results.files(self.get_task(request_id, tenant=tenant))


def default_registry(settings: Settings, dynamodb: Any) -> DefinitionRegistry | None:
    """Definitions from the table and/or directories the settings name (None: no checks)."""
    if not settings.definitions_table and not settings.definitions_dir:
        return None
    # Producers validate against what is stored now: no cache.
    return DefinitionRegistry.from_settings(settings, dynamodb, cache_seconds=0)
