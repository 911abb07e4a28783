"""The sample definitions load, and their sample inputs render into prompts (no CLI run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_support import SAMPLES
from jsonschema import Draft202012Validator

from agentq.config import Settings
from agentq.definitions import load_directory
from agentq.local.model_server import generate_value
from worker.kinds.agent.spec import AgentSpec

pytestmark = pytest.mark.timeout(30)

INPUTS = SAMPLES / "inputs"


def _sample_inputs() -> dict[str, list[dict[str, object]]]:
    documents = sorted(INPUTS.glob("*.md"))
    return {
        "summarize": [{"document": p.read_text()} for p in documents],
        "classify-ticket": [json.loads((INPUTS / "ticket-refund-double-charge.json").read_text())],
        "review-diff": [json.loads((INPUTS / "diff-retry-backoff.json").read_text())],
        "report": [{"summaries": [{"title": p.stem, "gist": "..."} for p in documents]}],
    }


def test_agent_samples_load_and_render_their_sample_inputs() -> None:
    definitions = load_directory(SAMPLES)
    inputs = _sample_inputs()
    assert set(definitions) == set(inputs)
    assert 4 <= len(inputs["summarize"]) <= 6
    for name, definition in definitions.items():
        spec = AgentSpec.from_settings(definition.settings, Settings())
        for payload in inputs[name]:
            prompt = spec.template.render(payload)
            assert prompt.count("<input name=") == len(spec.template.placeholders)


@pytest.mark.parametrize("name", ["summarize", "report", "classify-ticket", "review-diff"])
def test_agent_sample_schemas_can_be_answered_offline(name: str) -> None:
    # What the offline model server would answer must satisfy the schema, or the
    # demo could never complete a sample task.
    schema = dict(load_directory(SAMPLES)[name].settings["output_schema"])
    value = generate_value(schema, "a prompt")
    assert not list(Draft202012Validator(schema).iter_errors(value))


def test_agent_sample_documents_are_short_and_real() -> None:
    for path in sorted(Path(INPUTS).glob("*.md")):
        words = len(path.read_text().split())
        assert 100 <= words <= 400, (path.name, words)
