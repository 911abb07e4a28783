"""What every part of `AgentqClient` shares: its stores, the parts other components
reuse (submitter, dispatcher), and reading one task or job back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.config import Settings
from agentq.continuation import transcripts_off_reason
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import validate_request_id
from agentq.errors import InvalidInput, NotFound
from agentq.events import REJECTED_REASON
from agentq.jobs import JobDispatcher, JobRecord, JobStore, ResultReader, TaskSubmitter
from agentq.jobs.spec import TaskSpec, validate_job_id
from agentq.publisher import EventPublisher
from agentq.states import TaskState
from agentq.store import EventStore, TaskRecord, TaskStore
from agentq.task_outputs import TaskOutputs

# What DynamoDB answers credentials without a grant (a producer reading tenant settings;
# "403" where the error body is not JSON, as moto's enforced server sends it).
_DENIED: Final = frozenset({"AccessDenied", "AccessDeniedException", "403"})


class ClientParts:
    """What every part of the client uses; `AgentqClient` is the class to build."""

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
        self.table_name = table
        self._sqs = sqs

    # -- parts other components reuse -----------------------------------------------
    @property
    def submitter(self) -> TaskSubmitter:
        return TaskSubmitter(
            tasks=self.tasks,
            publisher=self.publisher,
            sqs=self._sqs,
            queue_url=self.settings.required("queue_url"),
            dynamodb=self.dynamodb,
            table_name=self.table_name,
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
            dynamodb=self.dynamodb,
            table_name=self.table_name,
        )

    # -- reading one task or job ------------------------------------------------------
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

    def transcripts(self, tenant: str) -> bool | None:
        """Whether the tenant stores agent transcripts; None when these credentials may not
        read tenant settings (a producer's may not: the operator's may)."""
        try:
            return self.tasks.tenant_limits().settings(tenant, consistent=True).transcripts
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _DENIED:
                return None
            raise

    def check_continuations(self, tenant: str, tasks: Iterable[TaskSpec]) -> None:
        """A job task that continues another is refused when its tenant stores no
        transcripts (known here); the worker refuses it anyway."""
        continuing = [task for task in tasks if task.continues is not None]
        if continuing and self.transcripts(tenant) is False:
            raise InvalidInput(f"tasks.{continuing[0].key}.continues",
                               transcripts_off_reason(tenant))  # fmt: skip

    def check_definition(self, name: str, field: str) -> TaskDefinition | None:
        if self.definitions is None:
            return None
        try:
            return self.definitions.get(name)
        except NotFound:
            raise InvalidInput(field, f"unknown task definition {name!r}") from None


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
