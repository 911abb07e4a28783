"""A task's STATE item as read: `TaskRecord`, decoded from DynamoDB's attribute form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store.codec import from_item

# The attempt number a task may reach whatever its definition's budget: one more for
# each attempt a shutdown released after its child started (that number is spent, the
# budget is not). Set by the worker's release, cleared by an operator's retry or redrive.
ATTEMPT_ALLOWANCE: Final = "attemptAllowance"


@dataclass(frozen=True, kw_only=True)
class TaskRecord:
    """A task's STATE item, as read."""

    request_id: str
    tenant: str
    state: TaskState
    attempt: int
    definition: str | None
    job_id: str | None
    owner: str | None
    lease_token: str | None
    effective_until_ms: int | None
    created_at_ms: int | None
    updated_at_ms: int | None
    raw: Mapping[str, Any]

    @property
    def envelope(self) -> Mapping[str, Any] | None:
        value = self.raw.get("envelope")
        return value if isinstance(value, Mapping) else None

    @property
    def attempt_allowance(self) -> int:
        allowance = self.raw.get(ATTEMPT_ALLOWANCE)
        return allowance if isinstance(allowance, int) else 0

    def attempt_budget(self, max_attempts: int) -> int:
        """The attempts the task may reach: `max_attempts`, or its allowance if higher."""
        return max(max_attempts, self.attempt_allowance)

    def lease_live(self, at_ms: int | None = None) -> bool:
        if self.state is not TaskState.PROCESSING or self.effective_until_ms is None:
            return False
        return self.effective_until_ms >= (now_ms() if at_ms is None else at_ms)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> TaskRecord:
        data = from_item(item)
        return cls(
            request_id=data["requestId"],
            tenant=data["tenant"],
            state=TaskState(data["state"]),
            attempt=int(data.get("attempt", 0)),
            definition=data.get("definition"),
            job_id=data.get("jobId"),
            owner=data.get("owner"),
            lease_token=data.get("leaseToken"),
            effective_until_ms=data.get("effectiveUntil"),
            created_at_ms=data.get("createdAt"),
            updated_at_ms=data.get("updatedAt"),
            raw=data,
        )
