"""The task-definition model, how definitions are read, and the registry a worker asks.

A message names a registered definition (never code or an import path); the
definition says which kind runs it and how. Definitions come from a directory of
YAML/JSON files (`TASK_DEFINITIONS_DIR`) and from the task-definitions table
(`TASK_DEFINITIONS_TABLE`); the table wins on a name clash, so operators can
override a bundled definition without a deploy.

A definition file::

    name: summarize
    kind: agent            # "python" | "agent"
    description: Summarize a document into a fixed schema
    timeout_s: 300         # child process timeout, at most 11 h (default CLAUDE_TIMEOUT)
    max_attempts: 3        # attempts before a terminal failure (default MAX_MESSAGE_RETRIES)
    priority: low          # tier when neither producer nor job names one (PRIORITIES)
    settings: {...}        # kind-specific: see worker.kinds.<kind>
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from agentq.definitions.watch import WatchedDirectories
from agentq.envelope import DEFINITION_PATTERN, PRIORITY_PATTERN, check_storable
from agentq.errors import ConfigError, InvalidInput, NotFound

if TYPE_CHECKING:  # the producer API's import does without the settings model
    from agentq.config import Settings

TaskKind = Literal["python", "agent"]
TASK_KINDS: Final[tuple[TaskKind, ...]] = get_args(TaskKind)
# A running task's message stays hidden only while the heartbeat may extend it: at most
# 12 hours from its receive (SQS's limit). 11 hours of child leave the last hour for the
# wait for a slot, the kill grace and the settle before the message is deleted.
MAX_TIMEOUT_S: Final = 11 * 3600


def _or_empty(value: object) -> object:
    # A blank `description:` or `settings:` line in YAML reads as null: it means none.
    return {} if value is None else value


def _within_visibility(timeout_s: float | None) -> float | None:
    if timeout_s is not None and timeout_s > MAX_TIMEOUT_S:
        raise ValueError(
            f"must be at most {MAX_TIMEOUT_S} s (11 hours), got {timeout_s:g}: SQS keeps a "
            "running task's message hidden at most 12 hours from its receive, and the "
            "last hour is kept for the wait for a slot and the settle"
        )
    return timeout_s


def _storable(settings: dict[str, Any]) -> dict[str, Any]:
    # Settings are an attribute of the definition's item (depth 1): what DynamoDB would
    # refuse (an empty key, a 40-digit number) is refused here, naming where, not by
    # the write (a 502 from the producer API, a failed deployment from the loader).
    try:
        check_storable(settings, name="settings", depth=1)
    except InvalidInput as exc:
        raise ValueError(exc.problem if exc.field == "settings" else str(exc)) from None
    return settings


class DefinitionBody(BaseModel):
    """A definition without its name (the producer API takes the name from the path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: TaskKind = Field(description="which task kind runs it")
    description: Annotated[str, BeforeValidator(lambda v: "" if v is None else str(v))] = ""
    timeout_s: Annotated[float | None, AfterValidator(_within_visibility)] = Field(
        default=None, gt=0, description="child timeout (s, at most 11 hours); default CLAUDE_TIMEOUT",
        json_schema_extra={"maximum": MAX_TIMEOUT_S},
    )  # fmt: skip
    max_attempts: int | None = Field(
        default=None, ge=1, description="attempts before a terminal failure"
    )
    priority: str | None = Field(
        default=None,
        pattern=PRIORITY_PATTERN.pattern,
        description="priority tier of its tasks when neither producer nor job names one",
    )
    settings: Annotated[dict[str, Any], BeforeValidator(_or_empty), AfterValidator(_storable)] = (
        Field(default_factory=dict, description="kind-specific settings")
    )


class TaskDefinition(DefinitionBody):
    """A registered definition. `settings` are the kind's own (worker.kinds.<kind>)."""

    model_config = ConfigDict(title="Task definition")
    name: Annotated[str, Field(strict=True)] = Field(
        pattern=DEFINITION_PATTERN.pattern, description="what messages name"
    )

    def timeout_ms(self, default_ms: int) -> int:
        return int(self.timeout_s * 1000) if self.timeout_s else default_ms

    def attempts(self, default: int) -> int:
        return self.max_attempts or default

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "definition") -> TaskDefinition:
        if not isinstance(data, Mapping):
            raise InvalidInput(source, "must be a mapping")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise _invalid(exc, source) from None


def _invalid(exc: ValidationError, source: str) -> InvalidInput:
    """The first problem as `InvalidInput`: unknown fields name the source, others the field."""
    errors = exc.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return InvalidInput(source, f"unknown field(s): {', '.join(unknown)}")
    first = errors[0]
    field = str(first["loc"][0]) if first["loc"] else source
    if first["type"] == "missing":
        return InvalidInput(f"{source}.{field}", "is required")
    if first["type"] == "value_error":
        return InvalidInput(field, str((first.get("ctx") or {})["error"]))
    if first["type"] == "literal_error":
        return InvalidInput(
            field, f"must be one of {', '.join(TASK_KINDS)}, got {first['input']!r}"
        )
    return InvalidInput(field, first["msg"])


DEFINITION_SUFFIXES: Final = (".yaml", ".yml", ".json")


def parse_definitions(text: str, *, source: str, json_format: bool = False) -> list[TaskDefinition]:
    """One definition, or a list of them, from YAML (or JSON) text; `source` names it in errors."""
    import yaml  # only files need it; the Lambdas read definitions from the table

    try:
        data = json.loads(text) if json_format else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidInput(source, f"unreadable: {exc}") from None
    items = data if isinstance(data, list) else [data]
    try:
        return [TaskDefinition.from_dict(item, source=source) for item in items]
    except InvalidInput as exc:
        if exc.field.startswith(source):
            raise
        # Whoever reads the error (a shell, a failed deployment) needs the file too.
        raise InvalidInput(source, f"{exc.field}: {exc.problem}") from None


def load_file(path: Path, *, source: str | None = None) -> list[TaskDefinition]:
    """One definition, or a list of them, from a YAML or JSON file."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise InvalidInput(source or str(path), "unreadable: not UTF-8 text") from None
    return parse_definitions(text, source=source or str(path), json_format=path.suffix == ".json")


def load_directory(directory: Path, *, label: str | None = None) -> dict[str, TaskDefinition]:
    """The definitions of a directory's YAML/JSON files (not its subdirectories).

    `label` replaces the directory's path in error messages (a deployment names the
    directory as the user gave it, not where it was unpacked).
    """
    definitions: dict[str, TaskDefinition] = {}
    for path in sorted(directory.glob("*")):
        if path.suffix not in DEFINITION_SUFFIXES or not path.is_file():
            continue
        source = f"{label}/{path.name}" if label else str(path)
        for definition in load_file(path, source=source):
            if definition.name in definitions:
                raise InvalidInput(source, f"defines {definition.name!r} twice")
            definitions[definition.name] = definition
    return definitions


class DefinitionsTable:
    """The task-definitions table (partition key `name`). The client is passed in.

    The DynamoDB codec (and with it boto3) is imported on use: every task child loads
    this module and talks to no AWS service, so it should not pay for boto3's import.
    """

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def get(self, name: str) -> TaskDefinition | None:
        from agentq.store.codec import from_item

        item = self._ddb.get_item(TableName=self._table, Key={"name": {"S": name}}).get("Item")
        return TaskDefinition.from_dict(from_item(item), source=f"table:{name}") if item else None

    def put(self, definition: TaskDefinition) -> None:
        from agentq.store.codec import to_item

        self._ddb.put_item(TableName=self._table, Item=to_item(definition.to_dict()))

    def delete(self, name: str) -> bool:
        response = self._ddb.delete_item(
            TableName=self._table, Key={"name": {"S": name}}, ReturnValues="ALL_OLD"
        )
        return bool(response.get("Attributes"))

    def all(self) -> list[TaskDefinition]:
        from agentq.store.codec import from_item

        return sorted(
            (TaskDefinition.from_dict(from_item(i), source="table") for i in self._scan()),
            key=lambda d: d.name,
        )

    def stored(self) -> dict[str, TaskDefinition | None]:
        """Every item by name; None for one that is no valid definition (written by hand,
        or by an older agentq), so a sync can replace it instead of failing on it."""
        from agentq.store.codec import from_item

        found: dict[str, TaskDefinition | None] = {}
        for item in self._scan():
            name = item.get("name", {}).get("S")
            if not isinstance(name, str):
                continue
            try:
                found[name] = TaskDefinition.from_dict(from_item(item), source=f"table:{name}")
            except InvalidInput:
                found[name] = None
        return found

    def _scan(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self._table}
        while True:
            # A handful of definitions: a scan of this small table is the right tool.
            response = self._ddb.scan(**kwargs)
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]


class DefinitionRegistry:
    """Looks definitions up by name: table first (cached briefly), then directory."""

    def __init__(
        self,
        *,
        directory_definitions: Mapping[str, TaskDefinition] | None = None,
        directories: WatchedDirectories[TaskDefinition] | None = None,
        table: DefinitionsTable | None = None,
        cache_seconds: float = 30.0,
    ) -> None:
        self._files = dict(directory_definitions or {})
        self._directories = directories
        self._table = table
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, TaskDefinition | None]] = {}
        self._lock = threading.Lock()
        self._fetching = threading.Lock()

    @classmethod
    def from_sources(
        cls,
        *,
        directories: Iterable[Path] = (),
        table: DefinitionsTable | None = None,
        cache_seconds: float = 30.0,
    ) -> DefinitionRegistry:
        watched = WatchedDirectories(directories, load_directory, DEFINITION_SUFFIXES)
        return cls(directories=watched, table=table, cache_seconds=cache_seconds)

    @classmethod
    def from_settings(
        cls, settings: Settings, dynamodb: Any, *, cache_seconds: float = 30.0
    ) -> DefinitionRegistry:
        """The directories and table that TASK_DEFINITIONS_DIR / TASK_DEFINITIONS_TABLE name."""
        for directory in settings.definitions_dirs:
            if not directory.is_dir():
                raise ConfigError("TASK_DEFINITIONS_DIR", f"{directory} is not a directory")
        table = (
            DefinitionsTable(dynamodb, settings.definitions_table)
            if settings.definitions_table
            else None
        )
        return cls.from_sources(
            directories=settings.definitions_dirs, table=table, cache_seconds=cache_seconds
        )

    def get(self, name: str) -> TaskDefinition:
        """The definition, or `NotFound` (a validation failure for the task)."""
        found = self._from_table(name)
        if found is None and self._directories is not None:
            found = self._directories.get(name)
        if found is None:
            found = self._files.get(name)
        if found is None:
            raise NotFound("task definition", name)
        return found

    def names(self) -> list[str]:
        names = set(self._files)
        if self._directories is not None:
            names.update(self._directories.names())
        if self._table is not None:
            names.update(d.name for d in self._table.all())
        return sorted(names)

    def _from_table(self, name: str) -> TaskDefinition | None:
        if self._table is None:
            return None
        with self._lock:
            cached = self._cache.get(name)
            if cached and time.monotonic() - cached[0] < self._cache_seconds:
                return cached[1]
        # One lookup per expiry, however many slots miss at once.
        with self._fetching:
            with self._lock:
                cached = self._cache.get(name)
                if cached and time.monotonic() - cached[0] < self._cache_seconds:
                    return cached[1]
            now = time.monotonic()
            found = self._table.get(name)
            with self._lock:
                self._cache[name] = (now, found)
            return found
