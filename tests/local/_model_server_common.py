"""For the model server's HTTP and CLI tests: report schema, usage keys, _key(), the server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.local.model_server import ModelServer

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)

REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "minLength": 10, "maxLength": 200},
        "severity": {"type": "string", "enum": ["low", "medium", "high"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "confidence": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "done": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "team": {"type": ["string", "null"]}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
    "required": ["summary", "severity", "score", "confidence", "done", "tags", "owner"],
    "additionalProperties": False,
}


def _key() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


# Named apart from its function: a test module imports the function, and its tests'
# `server` parameters would otherwise redefine the import.
@pytest.fixture(scope="module", name="server")
def fixture_server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv
