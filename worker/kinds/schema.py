"""The JSON Schema of definition files, for editors: `python -m worker.kinds.schema`.

It combines the definition model (agentq.definitions) with each kind's settings
model, chosen by `kind`, and is committed as definitions/schema.json (a test fails
when it is stale). Point an editor at it, e.g. for YAML:
`# yaml-language-server: $schema=../schema.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from agentq.definitions import TaskDefinition
from worker.kinds.agent.spec import AgentSettings

SCHEMA_FILE: Final = Path(__file__).resolve().parents[2] / "definitions" / "schema.json"


class PythonSettings(BaseModel):
    """The `settings` of a python definition (worker/kinds/python.py)."""

    model_config = ConfigDict(extra="forbid", title="Python settings")
    callable: str = Field(
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="'package.module:function' of a callable the operator controls",
    )


class PythonDefinition(TaskDefinition):
    model_config = ConfigDict(title="Python task definition")
    kind: Literal["python"]
    settings: PythonSettings  # type: ignore[assignment]


class AgentDefinition(TaskDefinition):
    model_config = ConfigDict(title="Agent task definition")
    kind: Literal["agent"]
    settings: AgentSettings  # type: ignore[assignment]


Definition = Annotated[PythonDefinition | AgentDefinition, Field(discriminator="kind")]


class DefinitionFile(RootModel[Definition | list[Definition]]):
    """A definition file: one definition, or a list of them."""


def schema() -> dict[str, Any]:
    document = DefinitionFile.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "agentq task definition file"
    return document


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.kinds.schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    if args.check:
        if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text(encoding="utf-8") != render():
            sys.stderr.write(f"{SCHEMA_FILE} is stale: run python -m worker.kinds.schema\n")
            return 1
        return 0
    SCHEMA_FILE.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
