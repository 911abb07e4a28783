"""Definition and job-spec models: the committed JSON Schema, and every refusal an InvalidInput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agentq.config import Settings
from agentq.definitions import TaskDefinition, load_file
from agentq.errors import ConfigError, InvalidInput
from agentq.jobs.spec import parse_spec
from worker.kinds import schema as definition_schema
from worker.kinds.agent.spec import AgentSpec

REPO = Path(__file__).resolve().parents[2]
DEFINITION_FILES = sorted(
    [*REPO.glob("definitions/**/*.yaml"), *REPO.glob("bench/definitions/*.yaml")]
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["name", "kind", "description", "timeout_s", "max_attempts", "settings", "other"]
)


def test_the_committed_schema_is_generated_from_the_models() -> None:
    assert definition_schema.main(["--check"]) == 0, (
        "definitions/schema.json is stale: run python -m worker.kinds.schema"
    )
    jsonschema.Draft202012Validator.check_schema(definition_schema.schema())


@pytest.mark.parametrize("path", DEFINITION_FILES, ids=lambda p: p.name)
def test_every_shipped_definition_file_fits_the_schema(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    jsonschema.validate(document, json.loads(definition_schema.SCHEMA_FILE.read_text()))
    assert load_file(path)


@pytest.mark.parametrize(
    "document",
    [
        {"name": "x", "kind": "shell", "settings": {}},
        {"name": "a b", "kind": "python", "settings": {"callable": "m:f"}},
        {"name": "x", "kind": "python", "settings": {"callable": "m:f"}, "retries": 1},
        {"name": "x", "kind": "agent", "timeout_s": 0, "settings": {}},
    ],
)
def test_the_schema_refuses_what_the_definition_model_refuses(document: dict[str, Any]) -> None:
    assert not jsonschema.Draft202012Validator(definition_schema.schema()).is_valid(document)
    with pytest.raises(InvalidInput):
        TaskDefinition.from_dict(document)


@pytest.mark.parametrize(
    "settings",
    [
        {"prompt": "p", "output_schema": {"type": "object"}, "turns": 1},
        {"prompt": "p", "output_schema": {"type": "object"}, "max_turns": 0},
        {"prompt": "p", "output_schema": {"type": "object"}, "permission_mode": "yolo"},
        {"output_schema": {"type": "object"}},
    ],
)
def test_the_schema_refuses_what_the_agent_settings_refuse(settings: dict[str, Any]) -> None:
    document = {"name": "x", "kind": "agent", "settings": settings}
    assert not jsonschema.Draft202012Validator(definition_schema.schema()).is_valid(document)
    with pytest.raises(InvalidInput):
        AgentSpec.from_settings(settings, Settings())


@given(st.dictionaries(FIELDS, JSON, max_size=6))
def test_a_definition_is_either_valid_or_an_invalid_input(data: dict[str, Any]) -> None:
    try:
        definition = TaskDefinition.from_dict(data, source="f.yaml")
    except InvalidInput as exc:
        assert exc.field.startswith(("f.yaml", *data)), exc
    else:
        assert TaskDefinition.from_dict(definition.to_dict()) == definition


@given(st.dictionaries(st.sampled_from(["tasks", "name", "failure_policy", "x"]), JSON, max_size=4))
def test_a_job_spec_is_either_valid_or_an_invalid_input(data: dict[str, Any]) -> None:
    try:
        spec = parse_spec(data)
    except InvalidInput:
        return
    assert parse_spec(spec.to_dict()) == spec


# Plausible values next to arbitrary ones, so that some specs are valid and round-trip.
VALUES = st.one_of(st.sampled_from(["d", "a", "b", ["a"], [1, 2], {"x": "${item}"}]), JSON)
TASK = st.dictionaries(
    st.sampled_from(["definition", "input", "depends_on", "group", "for_each", "x"]),
    VALUES,
    max_size=4,
)
TASKS = st.one_of(
    st.dictionaries(st.sampled_from(["a", "b", "c d"]), TASK, max_size=3),
    st.lists(
        st.builds(lambda key, task: {"key": key, **task}, st.sampled_from(["a", "b", 7]), TASK),
        max_size=3,
    ),
)


@given(TASKS, st.sampled_from(["fail_fast", "continue", "never"]))
def test_a_job_spec_in_either_form_is_valid_or_an_invalid_input(tasks: Any, policy: str) -> None:
    try:
        spec = parse_spec({"tasks": tasks, "failure_policy": policy})
    except InvalidInput:
        return
    assert parse_spec(spec.to_dict()) == spec


def test_a_timeout_longer_than_sqs_can_hide_a_running_task_is_refused_clearly() -> None:
    """SQS hides a received message at most 12 hours from its receive: a definition may
    run its child 11 hours at most (the last hour: the wait for a slot, the settle)."""
    longest = {"name": "x", "kind": "python", "timeout_s": 11 * 3600,
               "settings": {"callable": "m:f"}}  # fmt: skip
    assert TaskDefinition.from_dict(longest).timeout_ms(1) == 39_600_000
    with pytest.raises(InvalidInput) as refused:
        TaskDefinition.from_dict({**longest, "timeout_s": 11 * 3600 + 1})
    assert str(refused.value).startswith("timeout_s: must be at most 39600 s (11 hours)")
    assert "12 hours from its receive" in str(refused.value)
    schema = jsonschema.Draft202012Validator(definition_schema.schema())
    assert schema.is_valid(longest)
    assert not schema.is_valid({**longest, "timeout_s": 11 * 3600 + 1})
    with pytest.raises(
        ConfigError, match="CLAUDE_TIMEOUT expected an integer from 100 to 39600000"
    ):
        Settings.from_env({"CLAUDE_TIMEOUT": str(11 * 3600 * 1000 + 1)})
