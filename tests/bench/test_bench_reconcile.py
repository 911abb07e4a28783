"""bench.reconcile at a small size: the lost task is re-sent within the cursor's bound,
no waiting task is duplicated, and a run reads no more than its page a partition."""

from __future__ import annotations

import pytest

from bench import reconcile

pytestmark = pytest.mark.timeout(600)


def test_the_reconciler_benchmark_reaches_the_lost_task_within_its_bound() -> None:
    figures = reconcile.run(tasks=300, page=20)

    assert figures["repaired_in_runs"] is not None
    assert figures["repaired_in_runs"] <= figures["bound_runs"]
    assert figures["repairs"] == 1 and figures["errors"] == 0
    # Four PENDING partitions hold the backlog; each page re-reads its cursor's item.
    assert figures["items_read_per_run_max"] <= 4 * (20 + 1)
    assert "runs until the lost task was re-sent" in reconcile.render(figures)
