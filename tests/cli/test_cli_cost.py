"""`agentq cost estimate` and docs/cost.md: one model, its prices dated and documented."""

from __future__ import annotations

import pytest
from cli_support import REPO, agentq, fresh_shell
from hypothesis import given
from hypothesis import strategies as st

from agentq.cost import MODEL_PRICES, PRICES, PRICES_AS_OF, STAGES, estimate

COST_DOC = REPO / "docs" / "cost.md"


def test_the_cli_prints_every_part_dated_and_the_comparison() -> None:
    ran = agentq(fresh_shell(), "cost", "estimate", "--tasks", "1000", "--stage", "prod",
                 "--json")  # fmt: skip
    assert ran.code == 0, ran
    data = ran.json()
    assert PRICES_AS_OF in data["prices"]
    assert set(data["aws_requests_per_1000_tasks_usd"]) == {
        "agentq", "a hand-rolled SQS consumer", "Step Functions Standard"}  # fmt: skip
    assert {"NAT gateways", "always-on workers", "KMS keys", "Secrets Manager", "dashboard",
            "VPC flow logs"} <= set(data["fixed_monthly_usd"])  # fmt: skip
    parts = (sum(data["aws_requests_by_service_usd"].values()) + data["worker_compute_usd"]
             + sum(data["fixed_monthly_usd"].values()) + data["model_usd"])  # fmt: skip
    assert data["total_usd"] == pytest.approx(parts, abs=0.05)
    shown = agentq(fresh_shell(), "cost", "estimate", "--stage", "dev", "--python")
    assert shown.code == 0 and "model:" not in shown.stdout and "NAT gateways" in shown.stdout
    bad = agentq(fresh_shell(), "cost", "estimate", "--tasks", "-1", "--json")
    assert bad.code == 6 and bad.json()["error"]["kind"] == "invalid"


@given(
    tasks=st.floats(min_value=0, max_value=1e7),
    seconds=st.floats(min_value=0, max_value=3600),
    stage=st.sampled_from(sorted(STAGES)),
    model=st.sampled_from(sorted(MODEL_PRICES)),
)
def test_request_and_model_costs_scale_with_tasks_and_fixed_costs_do_not(
    tasks: float, seconds: float, stage: str, model: str
) -> None:
    one = estimate(tasks=tasks, task_seconds=seconds, stage=stage, model=model,
                   input_tokens=1000, output_tokens=100)  # fmt: skip
    two = estimate(tasks=2 * tasks, task_seconds=seconds, stage=stage, model=model,
                   input_tokens=1000, output_tokens=100)  # fmt: skip
    assert two.fixed == one.fixed
    for design, parts in one.aws_per_task_design.items():
        assert sum(two.aws_per_task_design[design].values()) == pytest.approx(
            2 * sum(parts.values())
        )
    assert two.model_usd == pytest.approx(2 * one.model_usd)
    assert one.total >= sum(one.fixed.values())


def test_the_doc_names_the_date_and_every_price() -> None:
    text = COST_DOC.read_text()
    assert PRICES_AS_OF in text
    for name, value in PRICES.items():
        assert f"`{name}`" in text and f"{value:g}" in text, name
    for model, (price_in, price_out) in MODEL_PRICES.items():
        assert model in text and f"${price_in:g}" in text and f"${price_out:g}" in text
