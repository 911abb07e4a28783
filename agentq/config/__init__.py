"""agentq's configuration: every environment variable, read in one typed place.

`settings` holds the model (`Settings`) and `env_name`; `places`, `worker` and
`services` declare its fields by concern, `fields` how a field is declared; `light`
reads the task child's few settings and the test clock without the model; `doc`
writes the reference table of docs/configuration.md.

The names below load the model on first use, not at import: a task child and a
Lambda's cold start import `agentq.config.light` without pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentq.config.light import clock_offset_ms
    from agentq.config.services import LogLevel
    from agentq.config.settings import Settings, env_name, env_names, reference_table
    from agentq.config.worker import SchedulerMode, WarmAgent

__all__ = [
    "LogLevel",
    "SchedulerMode",
    "Settings",
    "WarmAgent",
    "clock_offset_ms",
    "env_name",
    "env_names",
    "reference_table",
]

_HOMES: Final = {
    "Settings": "agentq.config.settings",
    "env_name": "agentq.config.settings",
    "env_names": "agentq.config.settings",
    "reference_table": "agentq.config.settings",
    "WarmAgent": "agentq.config.worker",
    "SchedulerMode": "agentq.config.worker",
    "LogLevel": "agentq.config.services",
    "clock_offset_ms": "agentq.config.light",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
