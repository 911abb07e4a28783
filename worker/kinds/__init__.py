"""Task kinds: how the child runs a definition of each `kind`.

A kind is a module with ``run(ctx: ChildContext) -> JSON-able result``. Raising is
failure; the child classifies the exception (agentq.taxonomy) into `error.json`.
Kinds are looked up by name here, never imported from anything a message says.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from agentq.config.light import ChildSettings
from agentq.errors import InvalidInput, NotFound

KINDS: Final[Mapping[str, str]] = {
    "python": "worker.kinds.python",
    "agent": "worker.kinds.agent",
}


@dataclass(frozen=True, kw_only=True)
class ChildDefinition:
    """The task's definition as the child reads it from task.json.

    The fields of `agentq.definitions.TaskDefinition`, without its pydantic model: the
    worker validated the definition when it took the task and wrote `to_dict()` of it,
    so the child only checks the shape it relies on, and stays clear of pydantic's
    import on every task's start (tests/unit/test_child_imports.py).
    """

    name: str
    kind: str
    description: str = ""
    timeout_s: float | None = None
    max_attempts: int | None = None
    priority: str | None = None
    settings: Mapping[str, Any]

    def timeout_ms(self, default_ms: int) -> int:
        return int(self.timeout_s * 1000) if self.timeout_s else default_ms

    def attempts(self, default: int) -> int:
        return self.max_attempts or default

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _DEFINITION_FIELDS}
        data["settings"] = dict(self.settings)
        return {name: value for name, value in data.items() if value is not None}

    @classmethod
    def from_dict(cls, data: object, *, source: str = "definition") -> ChildDefinition:
        if not isinstance(data, Mapping):
            raise InvalidInput(source, "must be a mapping")
        unknown = sorted(str(name) for name in set(data) - set(_DEFINITION_FIELDS))
        if unknown:
            raise InvalidInput(source, f"unknown field(s): {', '.join(unknown)}")
        for required in ("name", "kind"):
            if not isinstance(data.get(required), str):
                raise InvalidInput(f"{source}.{required}", "is required (text)")
        settings = data.get("settings") or {}
        if not isinstance(settings, Mapping):
            raise InvalidInput("settings", "must be a mapping")
        timeout, attempts = data.get("timeout_s"), data.get("max_attempts")
        priority = data.get("priority")
        return cls(
            name=data["name"],
            kind=data["kind"],
            description=str(data.get("description") or ""),
            timeout_s=_seconds(timeout, "timeout_s"),
            max_attempts=_whole(attempts, "max_attempts"),
            priority=None if priority is None else str(priority),
            settings=dict(settings),
        )


_DEFINITION_FIELDS: Final = tuple(field.name for field in dataclasses.fields(ChildDefinition))


def _number(value: object, field: str) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, f"must be a number, got {type(value).__name__}")
    return value


def _seconds(value: object, field: str) -> float | None:
    number = _number(value, field)
    return None if number is None else float(number)


def _whole(value: object, field: str) -> int | None:
    number = _number(value, field)
    if number is None:
        return None
    if isinstance(number, float) and not number.is_integer():
        raise InvalidInput(field, "must be a whole number")
    return int(number)


@dataclass(frozen=True, kw_only=True)
class ChildContext:
    """Everything a kind may use; paths are inside the task's own directory."""

    request_id: str
    tenant: str
    attempt: int
    job_id: str | None
    definition: ChildDefinition
    input: Mapping[str, Any]
    task_dir: Path
    settings: ChildSettings
    # This attempt's lease token (None from a worker that predates it): with `attempt`,
    # the fencing token for side effects of the task's own (docs/child-protocol.md).
    lease_token: str | None = None
    # What the worker found to resume this attempt from (an agent definition with
    # `resume: true`): {"from_attempt": n} beside the restored file, or {"unreadable": why}.
    resume: Mapping[str, Any] | None = None
    # A continuation's follow-up (TaskEnvelope.prompt): the next user turn of the session
    # it continues, in place of the definition's prompt.
    follow_up: str | None = None

    @property
    def fencing_token(self) -> str:
        """`attempt:leaseToken`: unique per attempt; a store that keeps the highest
        attempt it has seen can refuse a stale holder's late write."""
        return f"{self.attempt}:{self.lease_token or ''}"

    @property
    def artifacts_dir(self) -> Path:
        return self.task_dir / "artifacts"

    @property
    def logs_dir(self) -> Path:
        return self.task_dir / "logs"

    @property
    def traces_dir(self) -> Path:
        return self.task_dir / "traces"

    @property
    def usage_file(self) -> Path:
        """Optional `{"usage": {...}, "cost_usd", "num_turns", "duration_ms"}` for events."""
        return self.task_dir / "usage.json"


class Kind(Protocol):
    def run(self, ctx: ChildContext) -> Any: ...


def load_kind(name: str) -> Kind:
    module_name = KINDS.get(name)
    if module_name is None:
        raise NotFound("task kind", name)
    module: Kind = importlib.import_module(module_name)  # type: ignore[assignment]
    return module
