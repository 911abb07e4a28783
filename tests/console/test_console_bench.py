"""The console benchmark's code path at a tiny size: every figure computed, not its speed."""

from __future__ import annotations

import pytest

from agentq.local.aws import MotoServer
from bench import console, report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_console_bench_counts_requests_per_refresh_within_the_bound(
    moto_server: MotoServer,
) -> None:
    figures = console.run(moto_server, tasks=5, jobs=3, searched=30)
    assert figures["job_page_drawn_ms"] > 0 and figures["jobs_list_drawn_ms"] > 0
    assert figures["job_page_server_ms"] <= figures["job_page_drawn_ms"]
    # One job read, one BatchGetItem for 5 tasks, one timeline query; one list query.
    assert figures["job_page_requests"] == {
        "dynamodb:GetItem": 1, "dynamodb:BatchGetItem": 1, "dynamodb:Query": 1,
    }  # fmt: skip
    assert figures["jobs_list_requests"] == {"dynamodb:Query": 1}
    assert figures["within_bound"] is True
    # The search found what it looks for: each task with "needle" in its id is one in
    # 1,000 (the 8th), so among 30 none, and the page still drew its answer.
    assert figures["tasks_search_drawn_ms"] > 0 and figures["tasks_by_state_drawn_ms"] > 0
    assert figures["tasks_search_requests"].get("dynamodb:Query", 0) >= 1
    assert not isinstance(report.table("console", figures), str)
