"""Whether an agent task resumes on a retry: its own `resume` (the envelope's per-task
override), else its definition's `resume: true`; only an agent task keeps a session.

The worker asks `resumes` before it restores or uploads a checkpoint; every view that
says whether a task keeps its session asks it too. Producers refuse an override for a
definition of another kind where they know the definition (`check_override`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.definitions import TaskDefinition
from agentq.errors import InvalidInput


def resumes(kind: str, settings: Mapping[str, Any], override: bool | None = None) -> bool:
    """The task's effective resume: `override` when set, else the definition's setting."""
    if kind != "agent":
        return False
    if override is not None:
        return override is True
    return settings.get("resume") is True


def override_of(envelope: Mapping[str, Any] | None) -> bool | None:
    """A stored envelope's per-task `resume` (None: not set, or not a boolean)."""
    value = (envelope or {}).get("resume")
    return value if isinstance(value, bool) else None


def check_override(definition: TaskDefinition | None, resume: bool | None, field: str) -> None:
    """Refuse a per-task `resume` for a definition that is not an agent's (when known)."""
    if resume is None or definition is None or definition.kind == "agent":
        return
    raise InvalidInput(
        field,
        f"{definition.name!r} is a {definition.kind} definition: only an agent task keeps "
        "a session to resume",
    )
