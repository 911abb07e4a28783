"""Checks a producer can make against an agent definition's prompt template before queueing.

The worker renders the template (worker/kinds/agent/prompt.py); this only reads its
`{placeholders}`, so a task that would fail there for a missing input is refused at
submit instead.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from agentq.definitions import TaskDefinition
from agentq.errors import InvalidInput


def check_prompt_inputs(definition: TaskDefinition, task_input: Mapping[str, Any]) -> None:
    """An agent task whose input lacks a `{placeholder}` of its prompt is refused at
    submit (exit 6), not queued to fail on a worker. A malformed template is the
    worker's to report (it names the definition's field)."""
    prompt = definition.settings.get("prompt") if definition.kind == "agent" else None
    if not isinstance(prompt, str):
        return
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(prompt) if name]
    except ValueError:
        return
    missing = [name for name in dict.fromkeys(names) if name not in task_input]
    if missing:
        raise InvalidInput(
            f"input.{missing[0]}",
            f"is required by the prompt of {definition.name!r}"
            + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""),
        )
