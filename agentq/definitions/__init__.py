"""Task definitions: what a message may ask a worker to run.

`registry` holds the definition model, how files and the definitions table are read
and the registry a worker looks names up in; `watch` reloads a directory whose files
change; `sync` makes the definitions table hold a set of definitions; `bundle` is the
zip a deployment ships them in.
"""

from __future__ import annotations

from agentq.definitions.registry import (
    DEFINITION_SUFFIXES,
    MAX_TIMEOUT_S,
    TASK_KINDS,
    DefinitionBody,
    DefinitionRegistry,
    DefinitionsTable,
    TaskDefinition,
    TaskKind,
    load_directory,
    load_file,
    parse_definitions,
)

__all__ = [
    "DEFINITION_SUFFIXES",
    "MAX_TIMEOUT_S",
    "TASK_KINDS",
    "DefinitionBody",
    "DefinitionRegistry",
    "DefinitionsTable",
    "TaskDefinition",
    "TaskKind",
    "load_directory",
    "load_file",
    "parse_definitions",
]
