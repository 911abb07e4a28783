"""The default model of agent tasks: a priced, mid-range model, with Opus one setting away."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.config import Settings
from agentq.config.light import DEFAULT_MODEL
from agentq.cost import MODEL_PRICES, estimate
from worker.kinds.agent.spec import AgentSpec

OPUS = "claude-opus-4-5"
_AGENT: dict[str, Any] = {
    "prompt": "Summarize {document}",
    "output_schema": {"type": "object", "properties": {"summary": {"type": "string"}}},
}


def test_the_default_model_is_priced_and_neither_the_dearest_nor_the_cheapest() -> None:
    assert Settings().model == DEFAULT_MODEL
    assert DEFAULT_MODEL in MODEL_PRICES
    prices = sorted(MODEL_PRICES.values())
    assert prices[0] < MODEL_PRICES[DEFAULT_MODEL] < prices[-1]


def test_opus_stays_reachable_by_setting_and_by_definition() -> None:
    by_setting = AgentSpec.from_settings(_AGENT, Settings.from_env({"CLAUDE_MODEL": OPUS}))
    assert by_setting.model == OPUS
    by_definition = AgentSpec.from_settings({**_AGENT, "model": OPUS}, Settings())
    assert by_definition.model == OPUS
    assert AgentSpec.from_settings(_AGENT, Settings()).model == DEFAULT_MODEL


def test_the_estimate_of_the_default_model_is_cheaper_than_opus() -> None:
    def month(model: str) -> float:
        return estimate(tasks=1000, task_seconds=120, stage="prod", model=model,
                        input_tokens=20_000, output_tokens=2_000).model_usd  # fmt: skip

    assert month(DEFAULT_MODEL) == pytest.approx(90.0)
    assert month(OPUS) == pytest.approx(150.0)
