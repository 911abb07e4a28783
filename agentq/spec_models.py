"""The shape of a job spec, as one set of pydantic models.

`agentq.jobs.spec.parse_spec` validates every spec with these models before it
expands fan-outs and resolves dependencies, and the producer API declares its request
bodies with them (so its OpenAPI document shows the same rules). They live outside
`agentq.jobs` so that the API can load them without the job store and boto3.

A shape error becomes `InvalidInput` naming the field (`tasks.a.definition`), as the
hand-written checks did.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, ValidationError

from agentq.envelope import DEFINITION_PATTERN, PRIORITY_PATTERN
from agentq.errors import InvalidInput

FailurePolicy = Literal["fail_fast", "continue"]
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = get_args(FailurePolicy)
TASK_NAME: Final = r"^[a-zA-Z0-9_-]{1,64}$"
JOB_ID: Final = r"^[a-zA-Z0-9_-]{1,128}$"
MAX_FAN_OUT: Final = 500

_NAME: Final = re.compile(TASK_NAME)


def _task_key(key: str) -> str:
    if not _NAME.fullmatch(key):
        raise ValueError(f"task keys must match {TASK_NAME}")
    return key


def _group(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"must match {TASK_NAME}")
    return name


def _definition(name: str) -> str:
    if not DEFINITION_PATTERN.fullmatch(name):
        raise ValueError(f"must match {DEFINITION_PATTERN.pattern}")
    return name


def _items(items: list[Any]) -> list[Any]:
    if not items:
        raise ValueError("must be a non-empty list")
    if len(items) > MAX_FAN_OUT:
        raise ValueError(f"at most {MAX_FAN_OUT} elements")
    return items


def _some_tasks(tasks: dict[str, TaskIn]) -> dict[str, TaskIn]:
    if not tasks:
        raise ValueError("a job needs at least one task")
    return tasks


TaskKey = Annotated[str, AfterValidator(_task_key)]
# Which tiers exist is configuration (PRIORITIES); the client checks the name against it.
Priority = Annotated[str, Field(pattern=PRIORITY_PATTERN.pattern, description="priority tier")]
DefinitionName = Annotated[str, Field(max_length=128), AfterValidator(_definition)]


class TaskIn(BaseModel):
    """One task of a job spec (see docs/jobs.md for references and fan-out)."""

    model_config = ConfigDict(extra="forbid")
    definition: DefinitionName
    input: dict[str, Any] | None = Field(default=None, description="JSON object; {} if absent")
    depends_on: list[str] | str | None = Field(
        default=None, description="task keys or group names (one as a string)"
    )
    group: Annotated[str, AfterValidator(_group)] | None = None
    not_before: str | float | None = Field(
        default=None,
        description="not run before this time: ISO 8601 with a zone, or epoch seconds",
    )
    for_each: Annotated[list[Any], AfterValidator(_items)] | None = Field(
        default=None, description=f"fan-out: one task per element (1 to {MAX_FAN_OUT})"
    )
    priority: Priority | None = Field(default=None, description="default: the job's")
    continues: str | None = Field(
        default=None,
        description="an agent task of this job whose final session this one continues "
        "(it depends on it); needs prompt",
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


Tasks = Annotated[dict[TaskKey, TaskIn], AfterValidator(_some_tasks)]


class TasksIn(BaseModel):
    """Tasks added to a running job."""

    model_config = ConfigDict(extra="forbid")
    tasks: Tasks


class JobIn(TasksIn):
    """A job spec as the producer API takes it (the tenant comes from the caller)."""

    job_id: str | None = Field(default=None, pattern=JOB_ID)
    name: str | None = Field(default=None, max_length=256)
    failure_policy: FailurePolicy | None = Field(default=None, description="default fail_fast")
    priority: Priority | None = Field(
        default=None, description="tier of its tasks that name none (default: the definition's)"
    )


class JobFile(JobIn):
    """A job spec as files and the Python client give it: a tenant may be named."""

    tenant: str | None = None


def invalid_input(exc: ValidationError, *, root: str = "spec") -> InvalidInput:
    """The first problem in `exc` as `InvalidInput`, its field a dotted path."""
    errors = exc.errors()
    first = errors[0]
    path = [str(part) for part in first["loc"] if part != "[key]"]
    if first["type"] == "extra_forbidden":
        parent = path[:-1]
        unknown = sorted(
            str(e["loc"][-1])
            for e in errors
            if e["type"] == "extra_forbidden" and [str(p) for p in e["loc"][:-1]] == parent
        )
        return InvalidInput(".".join(parent) or root, f"unknown field(s): {', '.join(unknown)}")
    if first["type"] == "missing":
        return InvalidInput(".".join(path), "is required")
    if first["type"] == "literal_error" and path == ["failure_policy"]:
        return InvalidInput("failure_policy", f"must be one of {', '.join(FAILURE_POLICIES)}")
    context = first.get("ctx") or {}
    problem = str(context["error"]) if first["type"] == "value_error" else first["msg"]
    return InvalidInput(".".join(path) or root, problem)
