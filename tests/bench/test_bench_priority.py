"""The priority benchmark's plan and table (the run itself is `python -m bench.priority`)."""

from __future__ import annotations

from pathlib import Path

from bench import report
from bench.priority import Sizes, plan


def test_the_plan_floods_low_first_then_spreads_high_and_normal_over_the_drain(
    tmp_path: Path,
) -> None:
    tasks, longest = plan(Sizes(low=40, high=5, normal=10), tmp_path / "side.jsonl")
    tiers = [p.tier for p in tasks]
    assert tiers[:40] == ["low"] * 40 and sorted(tiers[40:]) == ["high"] * 5 + ["normal"] * 10
    assert all(p.delay_s == 0 for p in tasks[:40])
    delays = [p.delay_s for p in tasks[40:]]
    assert delays == sorted(delays) and delays[0] > 0
    tenants = {p.tier: p.envelope.tenant for p in tasks}
    assert tenants == {"low": "tenant-a", "high": "tenant-b", "normal": "tenant-c"}
    assert all(0.2 <= p.envelope.input["seconds"] <= longest <= 1.0 for p in tasks)
    assert all(p.envelope.priority == p.tier for p in tasks)


def test_the_table_and_the_verdicts_render_a_result() -> None:
    row = {"high": {"p50": 0.5, "p95": 1.1, "max": 1.3}, "normal": {"p50": 1, "p95": 2, "max": 3},
           "low": {"p50": 3, "p95": 5, "max": 6}, "longest_task_s": 1.0,
           "requests_per_task": 9.5, "attributes_per_task": 0.02,
           "per_receive_attributes_per_task": 1.5}  # fmt: skip
    result = {"sizes": {"low": 4, "high": 1, "normal": 1}, "workers": 2, "slots": 4,
              "modes": {"baseline": row, "weighted": row, "strict": row}}  # fmt: skip
    assert not isinstance(report.table("priority", result), str)
    verdicts = report.verdicts({"priority": result})
    assert verdicts.row_count == 2
