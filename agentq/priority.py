"""Priority tiers on the producer side: which tier a task goes to (docs/scheduling.md).

A task's tier is the producer's choice, else its job's, else its definition's, else
DEFAULT_PRIORITY; each tier is its own SQS queue (`Settings.tier_queue_urls`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentq.config import Settings
from agentq.errors import InvalidInput

if TYPE_CHECKING:
    from agentq.definitions import TaskDefinition
    from agentq.jobs.spec import JobSpec


def check_priority(settings: Settings, priority: str | None, field: str) -> None:
    """InvalidInput naming `field` unless `priority` is absent or a configured tier."""
    if priority is not None and priority not in settings.priorities:
        tiers = ", ".join(settings.priorities)
        raise InvalidInput(field, f"unknown priority {priority!r}: one of {tiers}")


def check_spec_priorities(settings: Settings, spec: JobSpec) -> None:
    check_priority(settings, spec.priority, "priority")
    for task in spec.tasks:
        check_priority(settings, task.priority, f"tasks.{task.key}.priority")


def resolve_priority(
    settings: Settings, priority: str | None, definition: TaskDefinition | None
) -> str | None:
    """The producer's (or job's) tier, else the definition's; None: the default tier.

    A definition naming a tier this deployment lacks falls back to the default tier
    rather than refusing the task: definitions outlive a change of PRIORITIES.
    """
    if priority is not None:
        return priority
    if definition is not None and definition.priority in settings.priorities:
        return definition.priority
    return None
