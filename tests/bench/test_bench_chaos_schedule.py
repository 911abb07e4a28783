"""The chaos harness's scheduling mix, small, with faults on.

Tasks on the three tiers, two limited tenants with more work than their seats, delayed
tasks with an undelayed copy sent at once, cancels at every moment (queued, delayed,
running, retrying, racing their end), tasks stored without a message for the
reconciler to find behind the waiting ones; workers killed, drained and frozen, ~5 % of
AWS calls failing. Every invariant holds, old and new: no attempt after a cancel
answer, no delayed task started early, no tenant over its limit and no seat left held,
every lost task re-sent and run, no task re-sent while a worker held it parked.

Each new invariant, its defect put back, fails this run (docs/benchmarks.md names them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentq.local.aws import MotoServer
from bench.chaos import ChaosConfig, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_bench_chaos_scheduling_mix_keeps_every_promise(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    # A reconciler bound of 10 s: a parked task is marked again within about 4.5 s (a
    # quarter of the bound, then its next wake within the 2 s back-off) by a worker
    # whose clock may run 2 s behind; the limited tenants' queues (10-20 s of work for
    # one seat) park past it (up to 30 s a park), so a reconciler that re-sent parked
    # tasks would be seen. No
    # staged close-outs: with this bound the reconciler re-sends their lapsed phantom
    # leases before the DLQ closes them out (test_bench_chaos.py runs them).
    config = ChaosConfig(tasks=36, workers=2, slots=3, kill_interval_s=(1.5, 3.0),
                         kill_until_done=0.95, timeout_s=600, faults=True,
                         freeze_share=0.4, min_worker_kills=2, min_stale_holders=1,
                         reconcile_lost_after_s=10, closeouts=0)  # fmt: skip
    report = run(config, server=moto_server, work_dir=tmp_path)
    summary = report.summary()
    print(summary, report.schedule)
    for finding in report.findings:
        print("finding:", finding)
    assert report.violations == [], "\n".join(report.violations)
    schedule = report.schedule
    assert schedule["tasks"] == 30, schedule
    # Every cancel was answered, and the answers include both kinds.
    assert sum(schedule["cancels"].values()) == 5 and not schedule["cancels"].get("error")
    assert schedule["cancels"].get("cancelled", 0) >= 1, schedule
    assert schedule["delayed"] >= 6, schedule
    assert schedule["lost_planted"] >= 2 and schedule["lost_repaired"] == schedule["lost_planted"]
    # The limited tenants' tasks ran, up to their limits.
    assert set(schedule["most_running"]) == {"chaos-lim-a", "chaos-lim-b"}, schedule
    assert all(n >= 1 for n in schedule["most_running"].values()), schedule
    # Tasks waited parked, so the re-send check judged something (2 to 14 a run).
    assert schedule["parked_tasks"] >= 1, schedule
