"""Job specs: parse, expand fan-outs, validate (references, cycles, definitions).

A spec (YAML or JSON; docs/jobs.md has the format) names tasks by key, each with its
definition, input, optional `for_each` fan-out and `depends_on`. A task depends on
every task its input references plus those in `depends_on` (task keys or group names).
Every problem is an `InvalidInput` naming the task, raised before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from agentq.definitions import TaskDefinition
from agentq.envelope import REQUEST_ID_PATTERN, check_storable
from agentq.errors import InvalidInput, NotFound
from agentq.jobs import refs
from agentq.jobs.refs import Ref
from agentq.prompts import check_prompt_inputs
from agentq.resume import check_override, resumes
from agentq.schedule import check_within_a_year, parse_time_ms
from agentq.spec_models import (
    FAILURE_POLICIES,
    MAX_FAN_OUT,
    FailurePolicy,
    JobFile,
    TaskIn,
    invalid_input,
)

__all__ = ["FAILURE_POLICIES", "MAX_FAN_OUT", "FailurePolicy", "JobSpec", "TaskSpec"]

MAX_TASKS: Final = 1000
MAX_JOB_ID_LENGTH: Final = 128
MAX_JOB_ITEM_BYTES: Final = 400 * 1024  # DynamoDB's item size limit
# The job item besides its spec and countedTasks: ids, tenant, name, counters, index
# keys (each id at most 128 characters, the name 256): well under this.
_JOB_ITEM_OVERHEAD: Final = 4 * 1024


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    key: str
    definition: str
    input: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()  # task keys, explicit and implied by references
    group: str | None = None
    not_before_ms: int | None = None  # epoch ms; the task is SCHEDULED until then
    priority: str | None = None
    # A continuation: the key of the task of this job whose final session it continues
    # (also a dependency), and the follow-up (agentq.continuation).
    continues: str | None = None
    prompt: str | None = None
    resume: bool | None = None  # its own resume on retry (None: the definition's)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"definition": self.definition, "input": dict(self.input)}
        if self.continues is not None:
            data.update(continues=self.continues, prompt=self.prompt)
        if self.resume is not None:
            data["resume"] = self.resume
        if self.depends_on:
            data["depends_on"] = list(self.depends_on)
        if self.group:
            data["group"] = self.group
        if self.not_before_ms is not None:
            data["not_before"] = self.not_before_ms  # epoch ms parse back as ms
        if self.priority:
            data["priority"] = self.priority
        return data


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    tasks: tuple[TaskSpec, ...]  # in dependency order: every task after its dependencies
    failure_policy: FailurePolicy = "fail_fast"
    name: str | None = None
    priority: str | None = None  # tier of the tasks that name none

    def task(self, key: str) -> TaskSpec:
        for task in self.tasks:
            if task.key == key:
                return task
        raise NotFound("job task", key)

    @property
    def keys(self) -> list[str]:
        return [task.key for task in self.tasks]

    @property
    def groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for task in self.tasks:
            if task.group:
                groups.setdefault(task.group, []).append(task.key)
        return groups

    @property
    def roots(self) -> list[TaskSpec]:
        return [task for task in self.tasks if not task.depends_on]

    def dependents(self, key: str) -> list[str]:
        return [task.key for task in self.tasks if key in task.depends_on]

    def to_dict(self) -> dict[str, Any]:
        """The expanded spec; parsing it again gives an equal spec (stored on the job)."""
        data: dict[str, Any] = {
            "failure_policy": self.failure_policy,
            "tasks": {task.key: task.to_dict() for task in self.tasks},
        }
        if self.name:
            data["name"] = self.name
        if self.priority:
            data["priority"] = self.priority
        return data


def load_spec_file(path: Path) -> dict[str, Any]:
    """The raw spec from a YAML or JSON file (parse it with `parse_spec`)."""
    import yaml  # only files need it; the producer API takes specs as JSON

    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(str(path), f"cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidInput(str(path), f"not valid {path.suffix or 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(str(path), "a job spec must be a mapping with `tasks`")
    return data


def parse_spec(data: Mapping[str, Any], *, existing: JobSpec | None = None) -> JobSpec:
    """Validate and expand a raw spec.

    With `existing`, `data["tasks"]` are tasks added to that job: they may depend on its
    tasks but not reuse their keys.
    """
    if not isinstance(data, Mapping):
        raise InvalidInput("spec", "must be a mapping with `tasks`")
    try:
        shape = JobFile.model_validate({**data, "tasks": _task_entries(data.get("tasks"))})
    except ValidationError as exc:
        raise invalid_input(exc) from None
    policy: FailurePolicy = shape.failure_policy or (
        existing.failure_policy if existing else "fail_fast"
    )
    name = shape.name if "name" in shape.model_fields_set else existing.name if existing else None
    priority = shape.priority or (existing.priority if existing else None)
    new = [task for key, raw in shape.tasks.items() for task in _expand(key, raw)]
    # The expanded spec is kept on the job item (spec → tasks → task → input), so what
    # DynamoDB would refuse is refused here, naming the task, not by the write.
    for task in new:
        check_storable(task.input, name=f"tasks.{task.key}.input", depth=4)
    if name is not None:
        check_storable(name, name="name")
    old = list(existing.tasks) if existing else []
    _check_keys(old, new)
    groups: dict[str, list[str]] = {}
    for task in [*old, *new]:
        if task.group:
            groups.setdefault(task.group, []).append(task.key)
    keys = {task.key for task in [*old, *new]}
    clash = sorted(set(groups) & keys)
    if clash:
        raise InvalidInput(f"tasks.{clash[0]}", "a group and a task share this name")
    resolved = [_with_dependencies(task, keys, groups) for task in new]
    ordered = _topological([*old, *resolved])
    if len(ordered) > MAX_TASKS:
        raise InvalidInput("tasks", f"a job holds at most {MAX_TASKS} tasks, got {len(ordered)}")
    return JobSpec(tasks=tuple(ordered), failure_policy=policy, name=name, priority=priority)


def check_definitions(tasks: Iterable[TaskSpec], lookup: Callable[[str], object]) -> None:
    """`lookup(name)` raises NotFound for an unknown definition; name the task then.

    An agent task whose input lacks a `{placeholder}` of its definition's prompt is
    refused here, as `submit` refuses it, rather than created to fail on a worker: a
    job task's input keys are known at creation even where their values are references
    resolved later.
    """
    found: dict[str, object] = {}
    tasks = list(tasks)
    for task in tasks:
        if task.definition not in found:
            try:
                found[task.definition] = lookup(task.definition)
            except NotFound:
                raise InvalidInput(
                    f"tasks.{task.key}.definition",
                    f"unknown task definition {task.definition!r}",
                ) from None
        definition = found[task.definition]
        if isinstance(definition, TaskDefinition):
            check_override(definition, task.resume, f"tasks.{task.key}.resume")
        if task.continues is not None:
            _check_continuation(task, definition, tasks, found)
        elif isinstance(definition, TaskDefinition):
            try:
                check_prompt_inputs(definition, task.input)
            except InvalidInput as missing:
                raise InvalidInput(f"tasks.{task.key}.{missing.field}", missing.problem) from None


def _check_continuation(
    task: TaskSpec, definition: object, tasks: list[TaskSpec], found: Mapping[str, object]
) -> None:
    """A continuation's prompt is its follow-up (no template to fill); it and the task it
    continues must be agent tasks, that one with resume on (its own `resume`, else its
    definition's: else it keeps no session)."""
    where = f"tasks.{task.key}"
    if isinstance(definition, TaskDefinition) and definition.kind != "agent":
        raise InvalidInput(f"{where}.definition", "only an agent task can continue another")
    source = next((t for t in tasks if t.key == task.continues), None)
    named = found.get(source.definition) if source is not None else None
    if source is None or not isinstance(named, TaskDefinition):
        return
    if source.resume is False:
        raise InvalidInput(f"{where}.continues", f"task {task.continues!r} keeps no session "
                           "to continue: it has resume: false")  # fmt: skip
    if not resumes(named.kind, named.settings, source.resume):
        raise InvalidInput(f"{where}.continues", f"task {task.continues!r} keeps no session "
                           f"to continue: its definition {named.name!r} has resume off")  # fmt: skip


def check_not_before(tasks: Iterable[TaskSpec], now_ms: int) -> None:
    """Refuse a task due more than a year ahead, as a single task's submit does. Checked
    where a job is created or extended, not in `parse_spec` (stored jobs read back)."""
    for task in tasks:
        if task.not_before_ms is not None:
            check_within_a_year(task.not_before_ms, now_ms, f"tasks.{task.key}.not_before")


def check_item_size(spec: JobSpec) -> None:
    """Refuse a spec the job item could not hold (DynamoDB items are at most 400 KB).

    The estimate is the expanded spec's JSON (every fan-out element in its task's
    input), the `countedTasks` set that grows to hold every key, and the item's other
    attributes. Checked where a job is created or extended, not in `parse_spec`,
    which also reads stored jobs back: one stored under another estimate stays readable.
    """
    text = json.dumps(spec.to_dict(), ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode()) + sum(len(key) + 1 for key in spec.keys) + _JOB_ITEM_OVERHEAD
    if size > MAX_JOB_ITEM_BYTES:
        raise InvalidInput(
            "tasks",
            f"the expanded spec needs about {size // 1024} KB on the job item, over "
            "DynamoDB's 400 KB item limit: keep large inputs in S3 and pass their keys",
        )


def validate_job_id(job_id: object) -> str:
    if (
        not isinstance(job_id, str)
        or not REQUEST_ID_PATTERN.fullmatch(job_id)
        or len(job_id) > MAX_JOB_ID_LENGTH
    ):
        raise InvalidInput("jobId", f"must match ^[a-zA-Z0-9_-]{{1,{MAX_JOB_ID_LENGTH}}}$")
    return job_id


def task_request_id(job_id: str, key: str) -> str:
    request_id = f"{job_id}-{key}"
    if not REQUEST_ID_PATTERN.fullmatch(request_id):
        raise InvalidInput(f"tasks.{key}", f"request id {request_id!r} is not valid")
    return request_id


# -- parsing helpers ------------------------------------------------------------------
def _task_entries(tasks: object) -> object:
    """The list form (`[{key: ..., ...}]`) as the mapping the model takes; else as is."""
    if not isinstance(tasks, list):
        return tasks
    entries: dict[str, Any] = {}
    for index, item in enumerate(tasks):
        if not isinstance(item, Mapping) or "key" not in item:
            raise InvalidInput(f"tasks[{index}]", "a task in a list needs a `key`")
        key = item["key"]
        if not isinstance(key, str):
            raise InvalidInput(f"tasks[{index}].key", "task keys must match ^[a-zA-Z0-9_-]{1,64}$")
        if key in entries:
            raise InvalidInput(f"tasks.{key}", "duplicate task key")
        entries[key] = {k: v for k, v in item.items() if k != "key"}
    return entries


def _expand(key: str, raw: TaskIn) -> list[TaskSpec]:
    where = f"tasks.{key}"
    definition = raw.definition
    task_input = raw.input or {}
    depends = [raw.depends_on] if isinstance(raw.depends_on, str) else raw.depends_on or []
    group = raw.group
    not_before = (
        None if raw.not_before is None else parse_time_ms(raw.not_before, f"{where}.not_before")
    )
    if (raw.continues is None) != (raw.prompt is None):
        missing = "prompt" if raw.prompt is None else "continues"
        raise InvalidInput(f"{where}.{missing}", "continues and prompt go together")
    follow_up = {"continues": raw.continues, "prompt": raw.prompt}
    if raw.for_each is None:
        if "for_each" in raw.model_fields_set:
            raise InvalidInput(f"{where}.for_each", "must be a non-empty list")
        for ref in refs.find_refs(task_input, f"{where}.input"):
            if ref.kind in ("item", "index"):
                raise InvalidInput(f"{where}.input", f"{ref} is only allowed in a for_each task")
        return [TaskSpec(key=key, definition=definition, input=dict(task_input),
                         depends_on=tuple(depends), group=group,
                         not_before_ms=not_before, priority=raw.priority,
                         resume=raw.resume, **follow_up)]  # fmt: skip
    items = raw.for_each
    if group is not None and group != key:
        raise InvalidInput(f"{where}.group", "a for_each task is its own group (its key)")
    expanded = []
    for index, item in enumerate(items):

        def element(ref: Ref, field: str, item: Any = item, index: int = index) -> Any:
            if ref.kind == "index":
                return index
            if ref.kind == "item":
                return refs.escape(refs.select(item, ref.path, field))
            return refs.KEEP

        expanded.append(
            TaskSpec(
                key=f"{key}_{index}",
                definition=definition,
                input=refs.substitute(dict(task_input), f"{where}.input", element),
                depends_on=tuple(depends),
                group=key,
                not_before_ms=not_before,
                priority=raw.priority,
                resume=raw.resume,
                **follow_up,
            )
        )
    return expanded


def _check_keys(old: list[TaskSpec], new: list[TaskSpec]) -> None:
    seen = {task.key for task in old}
    for task in new:
        if task.key in seen:
            raise InvalidInput(f"tasks.{task.key}", "duplicate task key")
        seen.add(task.key)


def _with_dependencies(task: TaskSpec, keys: set[str], groups: Mapping[str, list[str]]) -> TaskSpec:
    where = f"tasks.{task.key}"
    needed: list[str] = []
    for name in task.depends_on:
        if name in keys:
            needed.append(name)
        elif name in groups:
            needed.extend(groups[name])
        else:
            raise InvalidInput(f"{where}.depends_on", f"no task or group named {name!r}")
    for ref in refs.find_refs(task.input, f"{where}.input"):
        if ref.kind == "task":
            if ref.name not in keys:
                raise InvalidInput(f"{where}.input", f"{ref} names no task of this job")
            needed.append(ref.name)
        elif ref.kind == "group":
            if ref.name not in groups:
                raise InvalidInput(f"{where}.input", f"{ref} names no group of this job")
            needed.extend(groups[ref.name])
        else:
            raise InvalidInput(f"{where}.input", f"{ref} is only allowed in a for_each task")
    if task.continues is not None:
        if task.continues not in keys:
            raise InvalidInput(f"{where}.continues", f"no task of this job named "
                               f"{task.continues!r}")  # fmt: skip
        needed.append(task.continues)  # it starts once the task it continues completed
    if task.key in needed:
        raise InvalidInput(where, "a task cannot depend on itself")
    return TaskSpec(key=task.key, definition=task.definition, input=task.input,
                    depends_on=tuple(dict.fromkeys(needed)), group=task.group,
                    not_before_ms=task.not_before_ms, priority=task.priority,
                    continues=task.continues, prompt=task.prompt,
                    resume=task.resume)  # fmt: skip


def _topological(tasks: list[TaskSpec]) -> list[TaskSpec]:
    """Dependencies first; tasks ready at the same time keep their declaration order.

    Stored jobs are compared with a new parse of their spec, so the order is part of
    the contract: each batch graphlib makes ready is sorted back into declaration order.
    """
    index = {task.key: i for i, task in enumerate(tasks)}
    sorter: TopologicalSorter[str] = TopologicalSorter()
    for task in tasks:
        sorter.add(task.key)
    for task in tasks:
        sorter.add(task.key, *task.depends_on)
    try:
        sorter.prepare()
    except CycleError as exc:
        # graphlib walks from a task to those depending on it; name the cycle the other
        # way, each task followed by what it waits for.
        cycle: list[str] = list(reversed(exc.args[1]))
        raise InvalidInput("tasks", f"dependency cycle: {' → '.join(cycle)}") from None
    by_key = {task.key: task for task in tasks}
    ordered: list[TaskSpec] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=index.__getitem__)
        ordered.extend(by_key[key] for key in ready)
        sorter.done(*ready)
    return ordered
