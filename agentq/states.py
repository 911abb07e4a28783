"""The task state machine.

PENDING → PROCESSING → COMPLETED | FAILED | TIMEOUT
PROCESSING → RETRYING → PROCESSING      (retryable failure, attempt-level)
BLOCKED → PENDING | SCHEDULED           (job task waiting on dependencies)
SCHEDULED → PROCESSING                  (delayed task, once `notBefore` has passed)
BLOCKED | SCHEDULED | PENDING | RETRYING → CANCELLED
PROCESSING → CANCELLED                  (cancel requested; its worker stopped the child)
BLOCKED → FAILED                        (its input cannot be resolved)

A task's state is read from its STATE item. A cancel request on a PROCESSING task is
a flag (`cancelRequested`), not a state: only the worker holding the lease ends it. `effectiveUntil` is set only while a lease
is live (PROCESSING); terminal states never expire.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from agentq.errors import InvalidTransition


class TaskState(StrEnum):
    BLOCKED = "BLOCKED"
    SCHEDULED = "SCHEDULED"
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    RETRYING = "RETRYING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def lockable(self) -> bool:
        """States a worker may lock without looking at a lease."""
        return self in (TaskState.PENDING, TaskState.RETRYING)


TERMINAL_STATES: Final = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.TIMEOUT, TaskState.CANCELLED}
)
LIVE_STATES: Final = frozenset(set(TaskState) - TERMINAL_STATES)

TRANSITIONS: Final[dict[TaskState, frozenset[TaskState]]] = {
    # BLOCKED → FAILED: the dispatcher cannot build the task's input (a missing upstream
    # result), so the task fails without ever running.
    TaskState.BLOCKED: frozenset(
        {TaskState.PENDING, TaskState.SCHEDULED, TaskState.CANCELLED, TaskState.FAILED}
    ),
    # SCHEDULED → FAILED: rejected or out of receives before it ever ran.
    TaskState.SCHEDULED: frozenset({TaskState.PROCESSING, TaskState.CANCELLED, TaskState.FAILED}),
    TaskState.PENDING: frozenset({TaskState.PROCESSING, TaskState.CANCELLED, TaskState.FAILED}),
    TaskState.PROCESSING: frozenset(
        {
            TaskState.PROCESSING,  # an expired lease taken over by another worker
            TaskState.RETRYING,
            TaskState.COMPLETED,
            TaskState.FAILED,
            TaskState.TIMEOUT,
            TaskState.CANCELLED,  # a cancel request its worker acted on
        }
    ),
    TaskState.RETRYING: frozenset({TaskState.PROCESSING, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.COMPLETED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.TIMEOUT: frozenset(),
    TaskState.CANCELLED: frozenset(),
}


def can_transition(current: TaskState, target: TaskState) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: TaskState, target: TaskState) -> None:
    if not can_transition(current, target):
        raise InvalidTransition(current.value, target.value)


def parse_state(value: str) -> TaskState:
    try:
        return TaskState(value)
    except ValueError:
        raise InvalidTransition(str(value), "a known state") from None
