"""Producer API Lambda (API Gateway REST, proxy integration, IAM auth by default).

Routes (OpenAPI document at `GET /openapi.json`):

    POST   /jobs                       create a job from a spec (docs/jobs.md)
    POST   /jobs/{job_id}/tasks        add tasks to a running job
    GET    /jobs                       the caller's jobs, newest first
    GET    /jobs/{job_id}              a job and its tasks
    POST   /tasks                      submit one task
    GET    /tasks/{request_id}         a task
    GET    /task-definitions           definitions
    GET    /task-definitions/{name}
    PUT    /task-definitions/{name}
    DELETE /task-definitions/{name}

The tenant comes from the request context, never from the body: the authorizer's
`tenant` (a Lambda authorizer puts it in its context), else the tenant an operator
mapped the IAM caller's role or user to (agentq.principals; an unmapped caller is
refused with 403 unless API_ACCOUNT_TENANT lets its account id stand in). Every read
and write is keyed by that tenant, so another tenant's job or task is simply not found
(404). Bad input is 400 (spec problems) or 422 (shape problems), each with a message
that names the field.

Task definitions are operator-owned (a python definition names code the worker
imports): every tenant may read them, only the IAM roles and users listed in
API_DEFINITION_ADMINS may put or delete them (403 otherwise; unset, nobody may).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import ForbiddenError, ServiceError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from agentq import __version__
from agentq.definitions import DefinitionBody, DefinitionsTable, TaskDefinition
from agentq.envelope import TENANT_PATTERN
from agentq.errors import InvalidInput, NotCancellable, NotFound, PrincipalNotMapped
from agentq.json_text import decode_json
from agentq.spec_models import JOB_ID, JobIn, Priority, TasksIn
from lambdas._common import powertools

if TYPE_CHECKING:
    from agentq.client import AgentqClient
    from agentq.config import Settings
    from agentq.jobs.store import JobRecord
    from agentq.principals import TenantResolver
    from agentq.store import TaskRecord

# Bodies are decoded strictly (agentq.json_text.decode_json): json.loads raises
# RecursionError on 1,000 brackets and ValueError on a 4,300-digit integer, which
# would escape as a 502; this raises InvalidInput, a 400 naming the problem.
app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=decode_json)
# The resolver builds the OpenAPI document from the routes and their models.
app.configure_openapi(
    title="agentq producer API",
    version=__version__,
    description="Submit tasks and jobs, read them back, manage task definitions.",
)
logger, metrics = powertools("producer-api")

_ID = JOB_ID


# -- request models ------------------------------------------------------------------------
# The job spec's models (JobIn, TasksIn) are the ones parse_spec validates with, and a
# definition's body is the definition's own model: one source for each shape, here and
# in the OpenAPI document.
class SubmitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    definition: str = Field(min_length=1, max_length=128)
    input: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, max_length=512)
    # At most one; agentq.schedule validates them (its errors answer 400).
    delay: float | None = Field(default=None, ge=0, description="seconds from now")
    not_before: str | float | None = Field(
        default=None, description="ISO 8601 time with a zone, or epoch seconds"
    )
    priority: Priority | None = Field(
        default=None, description="priority tier (default: the definition's, else normal)"
    )
    continues: str | None = Field(
        default=None,
        pattern=r"^[a-zA-Z0-9_-]{1,256}$",
        description="a COMPLETED agent task of the caller's to continue (needs prompt)",
    )
    prompt: str | None = Field(
        default=None, min_length=1, max_length=100_000,
        description="the follow-up: the next user turn of the session `continues` names",
    )  # fmt: skip
    resume: StrictBool | None = Field(
        default=None,
        description="an agent task: resume its session on a retry (true) or not (false), "
        "whatever its definition's resume (default: the definition decides)",
    )


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="cancelled by request", min_length=1, max_length=256)


# -- context -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _client_for(settings: Settings) -> AgentqClient:
    # Built on the first request (never at import) and kept for the warm container; the
    # client and the job views (agentq.jobs, the store) load with it, like boto3.
    from agentq.client import AgentqClient

    return AgentqClient.from_env(settings)


def _job_dict(
    job: JobRecord, tasks: Mapping[str, TaskRecord | None] | None = None
) -> dict[str, Any]:
    from agentq.jobs.summary import job_dict

    return job_dict(job, tasks)


def _task_dict(record: TaskRecord) -> dict[str, Any]:
    from agentq.jobs.summary import task_dict

    return task_dict(record)


def _client() -> AgentqClient:
    from agentq.config import Settings  # the settings model: with the client, not at import

    return _client_for(Settings.from_env())


def warm() -> None:
    """What the first request builds: settings, boto3 and the client's AWS clients."""
    _client()
    import agentq.jobs.summary  # noqa: F401


@functools.lru_cache(maxsize=4)
def _resolver_for(settings: Settings) -> TenantResolver:
    # One per warm container (and settings): its cache is what bounds a revoked
    # mapping's life to API_TENANT_CACHE_SECONDS.
    from agentq.principals import PrincipalTenants, TenantResolver

    store = PrincipalTenants(_client_for(settings).dynamodb, settings.required("table_name"))
    return TenantResolver(
        store, ttl_s=settings.api_tenant_cache_s, account_fallback=settings.api_account_tenant
    )


def tenant_of(event: Mapping[str, Any]) -> str:
    """The caller's tenant: the authorizer's `tenant`, else its IAM principal's mapping."""
    context = event.get("requestContext") or {}
    authorizer = context.get("authorizer") or {}
    tenant = authorizer.get("tenant") or (authorizer.get("lambda") or {}).get("tenant")
    if tenant:
        if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
            raise ForbiddenError("no tenant: the authorizer's tenant is not a valid name")
        return tenant
    identity = context.get("identity") or {}
    from botocore.exceptions import BotoCoreError, ClientError

    from agentq.config import Settings  # the settings model: at the first call, not import

    try:
        return _resolver_for(Settings.from_env()).tenant(
            identity.get("userArn"), identity.get("accountId")
        )
    except (BotoCoreError, ClientError) as exc:
        # botocore already retried a throttle; a stale answer is never served instead,
        # or a revoked mapping could outlive its bound.
        logger.warning("tenant lookup failed", extra={"error": type(exc).__name__})
        raise ServiceError(503, "the tenant lookup failed; try again") from None


def _tenant() -> str:
    return tenant_of(app.current_event.raw_event)


def _require_operator() -> None:
    """Only a configured admin principal may change the shared definitions."""
    from agentq.config import Settings  # the settings model: at the first call, not import
    from agentq.principals import is_operator, operator_keys

    identity = (app.current_event.raw_event.get("requestContext") or {}).get("identity") or {}
    admins = operator_keys(Settings.from_env().api_definition_admins_list)
    if not is_operator(identity.get("userArn"), admins):
        logger.warning("definition change refused: not an operator")
        raise ForbiddenError(
            "task definitions are operator-owned: only the principals in "
            "API_DEFINITION_ADMINS may change them"
        )


def _definitions() -> DefinitionsTable:
    client = _client()
    return DefinitionsTable(client.dynamodb, client.settings.required("definitions_table"))


# -- jobs ----------------------------------------------------------------------------------
@app.post("/jobs", summary="Create a job", responses={201: {"description": "job created"}})
def create_job(body: JobIn) -> tuple[dict[str, Any], int]:
    spec = body.model_dump(exclude_none=True, exclude={"job_id"})
    job = _client().create_job(spec, job_id=body.job_id, tenant=_tenant())
    metrics.add_metric(name="JobsCreated", unit=MetricUnit.Count, value=1)
    return _job_dict(job), 201


@app.post("/jobs/<job_id>/tasks", summary="Add tasks to a running job")
def add_tasks(
    job_id: Annotated[str, Path(pattern=_ID)], body: TasksIn
) -> tuple[dict[str, Any], int]:
    tasks = {k: v.model_dump(exclude_none=True) for k, v in body.tasks.items()}
    job = _client().add_tasks(job_id, tasks, tenant=_tenant())
    metrics.add_metric(name="JobTasksAdded", unit=MetricUnit.Count, value=len(tasks))
    return _job_dict(job), 201


@app.get("/jobs", summary="The caller's jobs, newest first")
def list_jobs(limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    jobs = _client().list_jobs(tenant=_tenant(), limit=limit)
    return {"jobs": [_job_dict(job) for job in jobs]}


@app.get("/jobs/<job_id>", summary="A job and its tasks")
def get_job(job_id: Annotated[str, Path(pattern=_ID)]) -> dict[str, Any]:
    client = _client()
    job = client.get_job(job_id, tenant=_tenant())
    return _job_dict(job, client.job_tasks(job))


# -- tasks ---------------------------------------------------------------------------------
@app.post("/tasks", summary="Submit one task")
def submit_task(body: SubmitIn) -> tuple[dict[str, Any], int]:
    record = _client().submit(
        body.definition, body.input, idempotency_key=body.idempotency_key, tenant=_tenant(),
        delay=body.delay, not_before=body.not_before, priority=body.priority,
        continues=body.continues, prompt=body.prompt, resume=body.resume,
    )  # fmt: skip
    metrics.add_metric(name="TasksSubmitted", unit=MetricUnit.Count, value=1)
    return _task_dict(record), 201


@app.get("/tasks/<request_id>", summary="A task")
def get_task(request_id: Annotated[str, Path(pattern=r"^[a-zA-Z0-9_-]{1,256}$")]) -> dict[str, Any]:
    return _task_dict(_client().get_task(request_id, tenant=_tenant()))


@app.get("/tasks/<request_id>/conversation", summary="An agent task's conversation")
def get_conversation(
    request_id: Annotated[str, Path(pattern=r"^[a-zA-Z0-9_-]{1,256}$")],
) -> dict[str, Any]:
    # Under the caller's tenant: another tenant's task of that id is not found.
    return _client().conversation(request_id, tenant=_tenant()).to_dict()


@app.post("/tasks/<request_id>/cancel", summary="Cancel a task (a running one is stopped)")
def cancel_task(
    request_id: Annotated[str, Path(pattern=r"^[a-zA-Z0-9_-]{1,256}$")],
    body: CancelIn | None = None,
) -> tuple[dict[str, Any], int]:
    client = _client()
    reason = (body or CancelIn()).reason
    [answer] = client.cancel(request_id, tenant=_tenant(), reason=reason)
    record = client.get_task(request_id, tenant=_tenant())
    # 202 when the running task was only asked to stop: its worker ends it.
    return _task_dict(record), 200 if answer.outcome == "cancelled" else 202


# -- task definitions ----------------------------------------------------------------------
@app.get("/task-definitions", summary="Task definitions")
def list_definitions() -> dict[str, Any]:
    _tenant()  # shared by all tenants, yet only callers acting for one
    return {"definitions": [d.to_dict() for d in _definitions().all()]}


@app.get("/task-definitions/<name>", summary="A task definition")
def get_definition(name: str) -> dict[str, Any]:
    _tenant()  # shared by all tenants, yet only callers acting for one
    found = _definitions().get(name)
    if found is None:
        raise NotFound("task definition", name)
    return found.to_dict()


@app.put("/task-definitions/<name>", summary="Create or replace a task definition")
def put_definition(name: str, body: DefinitionBody) -> dict[str, Any]:
    _require_operator()
    definition = TaskDefinition.from_dict({"name": name, **body.model_dump(exclude_none=True)})
    _definitions().put(definition)
    return definition.to_dict()


@app.delete("/task-definitions/<name>", summary="Delete a task definition")
def delete_definition(name: str) -> dict[str, Any]:
    _require_operator()
    if not _definitions().delete(name):
        raise NotFound("task definition", name)
    return {"deleted": name}


@app.get("/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    return Response(
        status_code=200,
        content_type=content_types.APPLICATION_JSON,
        body=app.get_openapi_json_schema(),
    )


# -- errors --------------------------------------------------------------------------------
def _error(status: int, message: str, **extra: Any) -> Response[str]:
    # Only the status and the field are logged: a message may quote the caller's input.
    logger.info("request refused", extra={"status": status, "field": extra.get("field")})
    metrics.add_metric(name=f"Refused{status}", unit=MetricUnit.Count, value=1)
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"message": message, **extra}),
    )


@app.exception_handler(NotFound)  # type: ignore[untyped-decorator]
def _not_found(error: NotFound) -> Response[str]:
    return _error(404, str(error))


@app.exception_handler(PrincipalNotMapped)  # type: ignore[untyped-decorator]
def _not_mapped(error: PrincipalNotMapped) -> Response[str]:
    return _error(403, str(error))


@app.exception_handler(NotCancellable)  # type: ignore[untyped-decorator]
def _not_cancellable(error: NotCancellable) -> Response[str]:
    return _error(409, str(error), field=error.field, state=error.state)


@app.exception_handler(InvalidInput)  # type: ignore[untyped-decorator]
def _invalid(error: InvalidInput) -> Response[str]:
    return _error(400, str(error), field=error.field)


@app.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]
def _malformed(error: RequestValidationError) -> Response[str]:
    # Pydantic's own messages name the field and the rule; no code or file names leak.
    problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()]
    return _error(422, "; ".join(problems), errors=problems)


# No @logger.inject_lambda_context: tests and local callers pass no Lambda context.
@metrics.log_metrics
def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    logger.set_correlation_id((event.get("requestContext") or {}).get("requestId"))
    result: dict[str, Any] = app.resolve(dict(event), context)
    return result
