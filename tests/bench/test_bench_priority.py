"""The priority benchmark's plan and table (the run itself is `python -m bench.priority`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import report
from bench.priority import Sizes, Starving, plan, plan_starving
from bench.priority_report import (
    breakdown,
    checks,
    lock_latencies,
    requests,
    table,
    verdicts,
)
from worker.telemetry import MetricsMiddleware, TaskEnd, TaskStart


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


def _row(high_p95: float, normal_p95: float, *, low_max: float = 40.0, gap: float = 2.0,
         ratio: float = 0.45) -> dict[str, Any]:  # fmt: skip
    return {"high": {"p50": 0.5, "p95": high_p95, "max": high_p95},
            "normal": {"p50": 0.5, "p95": normal_p95, "max": normal_p95},
            "low": {"p50": 10.0, "p95": 30.0, "max": low_max}, "low_longest_gap_s": gap,
            "longest_task_s": 1.0, "requests_per_task": 3.5,
            "requests_per_task_without_s3": 2.7, "seed_per_task": 6.0, "ratio_to_seed": ratio,
            "attributes_per_task": 0.0, "per_receive_attributes_per_task": 3.0,
            "calls_per_task": {"sqs:ReceiveMessage": 0.4},
            "scheduler_per_task": {"receives": 0.4, "emptyReceives": 0.1}}  # fmt: skip


def test_the_targets_are_judged_against_the_idle_reference_and_the_bound() -> None:
    result = {"sizes": {"low": 4, "high": 1, "normal": 1}, "workers": 2, "slots": 4,
              "starvation_bound_s": 30.0,
              "modes": {"strict": _row(1.5, 3.0, low_max=35.0),
                        "weighted": _row(1.8, 2.5, gap=31.0, ratio=0.6),
                        "weighted+limit": _row(1.2, 0.9), "idle": _row(0.5, 0.5)}}  # fmt: skip
    found = {label.split(" (")[0]: (measured, met) for label, measured, met in checks(result)}
    assert found["weighted: high p95 wait ≤ 2 x longest task"] == ("1.80 s", True)
    assert found["weighted: the low tier waits ≤ the starvation bound"] == ("31.0 s", False)
    assert found["weighted: no low task waits > the bound"] == ("40.0 s (strict 35.0 s)", False)
    assert found["weighted: requests/task ≤ 0.5 x the seed design on the same run"][1] is False
    assert found["with a tenant limit: B's p95 wait ≤ 2 x idle"] == ("1.20 s", False)
    assert found["with a tenant limit: C's p95 wait ≤ 2 x idle"] == ("0.90 s", True)
    assert found["without a tenant limit: C's p95 wait ≤ 2 x idle"] == ("2.50 s", False)
    for render in (table, breakdown, verdicts):
        assert render(result).row_count > 0


def test_the_starving_plan_sends_more_high_work_than_the_fleet_runs_and_low_work_inside_it(
    tmp_path: Path,
) -> None:
    sizes = Starving(high_rate=16.0, high_s=10.0, low=4)
    tasks, _ = plan_starving(sizes, tmp_path / "side.jsonl")
    high = [p.delay_s for p in tasks if p.tier == "high"]
    low = [p.delay_s for p in tasks if p.tier == "low"]
    assert len(high) == 160 and len(low) == 4
    # 16 a second against the fleet's ~13 (8 slots, 0.6 s tasks): the tier never drains.
    assert max(high) - min(high) < sizes.high_s and len(high) / sizes.high_s > 8 / 0.6
    assert min(high) < min(low) and max(low) < max(high), "every low task meets high work"
    assert [p.delay_s for p in tasks] == sorted(p.delay_s for p in tasks)
    assert {p.envelope.tenant for p in tasks if p.tier == "low"} == {"tenant-a"}


def test_the_starving_verdict_allows_the_bound_plus_one_task_and_shows_strict() -> None:
    bound = 30.0
    weighted = _row(55.0, 0.0, low_max=30.4)
    result = {"sizes": {"low": 4, "high": 1, "normal": 1}, "workers": 2, "slots": 4,
              "starvation_bound_s": bound,
              "modes": {"starving-strict": _row(50.0, 0.0, low_max=94.5),
                        "starving-weighted": weighted}}  # fmt: skip
    ((label, measured, met),) = [c for c in checks(result) if c[0].startswith("high work beyond")]
    assert (measured, met) == ("30.4 s (strict 94.5 s)", True) and "(31 s)" in label
    weighted["low"]["max"] = 31.2
    assert not next(c for c in checks(result) if c[0].startswith("high work beyond"))[2]


def test_the_requests_count_the_messages_the_workers_passed_on() -> None:
    stats = [{"verdicts": {"passed_on": 3, "ok": 40}}, {"verdicts": {"ok": 57}}, {}]
    figures = requests(calls={"sqs:ReceiveMessage": 50}, stats=stats, tasks=100,
                       heartbeats=0, tiers=3)  # fmt: skip
    assert figures["passed_on_per_task"] == 0.03
    rendered = breakdown({"modes": {"weighted": figures}})
    assert "passed on" in rendered.columns[0]._cells


def test_lock_latencies_are_read_per_tier_from_the_workers_metric_lines(tmp_path: Path) -> None:
    # The lines the worker really writes (worker.telemetry), among its log records.
    lines: list[str] = ['{"level":"INFO","message":"message received","tier":"high"}']
    metrics = MetricsMiddleware(slots_busy=lambda: 1, counter=None, stage="qa",
                                write=lines.append, tiers=("high", "low"))  # fmt: skip
    for n, (tier, lock_ms) in enumerate([("high", 10), ("high", 30), ("high", 20),
                                         ("low", 400), ("high", None)]):  # fmt: skip
        start = TaskStart(request_id=f"r-{n}", tenant="t", definition="d", attempt=1,
                          queue_wait_ms=1, tier=tier, lock_ms=lock_ms)  # fmt: skip
        metrics.before_process(start)
        metrics.after_process(TaskEnd(start=start, result="completed", duration_ms=5))
    first, second = tmp_path / "w0.log", tmp_path / "w1.log"
    first.write_text("\n".join(lines[:4]) + "\nnot json\n")
    second.write_text("\n".join(lines[4:]) + "\n")
    figures = lock_latencies([first, second])
    # The fleet's lines (no tier) are not counted again beside the tiers'.
    assert figures == {"high": {"p50": 20.0, "p95": 30.0, "max": 30.0},
                       "low": {"p50": 400.0, "p95": 400.0, "max": 400.0}}  # fmt: skip
