"""The clock-skew budget always fits inside the lease, beside the fences it shifts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentq.config import Settings
from worker.child.leasefile import CLOCK_SKEW_BUDGET_S, SETTLE_S, margins, skew_budget


@st.composite
def _settings(draw: st.DrawFn) -> Settings:
    amount = draw(st.integers(min_value=1, max_value=900))
    interval = draw(st.integers(min_value=50, max_value=int(amount * 1000 * 0.9)))
    grace = draw(st.integers(min_value=0, max_value=30_000))
    return Settings(extension_interval_ms=interval, extension_amount_s=amount,
                    kill_grace_ms=grace)  # fmt: skip


@given(_settings())
def test_the_skew_budget_moves_the_kill_and_stays_inside_a_renewal(settings: Settings) -> None:
    budget = skew_budget(settings)
    m = margins(settings)
    lowest_normal = settings.lease_seconds - settings.extension_interval_ms / 1000
    assert 0 <= budget <= CLOCK_SKEW_BUDGET_S
    assert m.kill_s == min(SETTLE_S, settings.lease_seconds / 6) + budget
    assert 0 < m.kill_s <= m.term_s <= m.fence_s < lowest_normal


def test_the_default_budget_is_two_seconds() -> None:
    assert skew_budget(Settings()) == 2.0
