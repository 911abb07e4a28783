"""Task kinds: how the child runs a definition of each `kind`.

A kind is a module with ``run(ctx: ChildContext) -> JSON-able result``. Raising is
failure; the child classifies the exception (agentq.taxonomy) into `error.json`.
Kinds are looked up by name here, never imported from anything a message says.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from agentq.config import Settings
from agentq.definitions import TaskDefinition
from agentq.errors import NotFound

KINDS: Final[Mapping[str, str]] = {
    "python": "worker.kinds.python",
    "agent": "worker.kinds.agent",
}


@dataclass(frozen=True, kw_only=True)
class ChildContext:
    """Everything a kind may use; paths are inside the task's own directory."""

    request_id: str
    tenant: str
    attempt: int
    job_id: str | None
    definition: TaskDefinition
    input: Mapping[str, Any]
    task_dir: Path
    settings: Settings
    # This attempt's lease token (None from a worker that predates it): with `attempt`,
    # the fencing token for side effects of the task's own (docs/child-protocol.md).
    lease_token: str | None = None

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
