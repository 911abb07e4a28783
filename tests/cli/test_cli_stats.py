"""`agentq stats` and the worker's per-tier and per-tenant EMF lines, through a real
worker on moto: tasks of two tenants on three tiers, some failing, one timing out."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli_support import agentq, fresh_shell, one_line_error
from conftest import Stack
from support import settle_indexes, store_events, wait_for

from agentq.aws import CallCounter
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env
from agentq.stats import StatsReader
from agentq.store import TaskRecord
from worker.telemetry import OTHER_TENANTS

pytestmark = pytest.mark.timeout(300)

SLOW_DEFINITION = """\
- name: stats-too-slow
  kind: python
  description: Sleeps past its one-second timeout, once.
  timeout_s: 1
  max_attempts: 1
  settings: {callable: "agentq.samples:sleep"}
"""
FAIL = {"category": "programming"}  # not retryable: fails on its first attempt
# (tenant, tier, definition, input) of every task submitted.
TASKS: list[tuple[str, str, str, dict[str, Any]]] = [
    *[("tenant-a", "high", "sample-noop", {})] * 3,
    ("tenant-a", "high", "sample-fail", FAIL),
    *[("tenant-b", "low", "sample-noop", {})] * 2,
    ("tenant-b", "low", "stats-too-slow", {"seconds": 20}),
    ("tenant-b", "normal", "sample-fail", FAIL),
]


def _env(stack: Stack, definitions: Path) -> dict[str, str]:
    return {**stack.env(), "TASK_DEFINITIONS_DIR": f"{SAMPLE_DEFINITIONS}{os.pathsep}{definitions}"}


def _ended(stack: Stack, submitted: list[TaskRecord]) -> bool:
    client_store = AgentqClient(
        settings=Settings.from_env(stack.env()), sqs=stack.sqs, dynamodb=stack.dynamodb,
        events=stack.events, s3=stack.s3,
    ).tasks  # fmt: skip
    for record in submitted:
        now = client_store.get(record.tenant, record.request_id)
        if now is None or not now.state.terminal:
            return False
    return True


def _emf(records: list[dict[str, Any]], dimension: str) -> Counter[tuple[str, str]]:
    """(dimension value, metric) -> summed value over the worker's EMF lines with it."""
    totals: Counter[tuple[str, str]] = Counter()
    for record in records:
        directive = record.get("_aws", {}).get("CloudWatchMetrics", [{}])[0]
        if [dimension] != [d for d in directive.get("Dimensions", [[]])[0] if d == dimension]:
            continue
        assert set(directive["Dimensions"][0]) == {"service", "stage", dimension}
        for metric in directive["Metrics"]:
            value = record[metric["Name"]]
            if metric["Name"].startswith("Tasks") and metric["Name"] != "TasksInFlight":
                totals[(record[dimension], metric["Name"])] += int(
                    sum(value) if isinstance(value, list) else value
                )
    return totals


def test_stats_counts_each_tier_and_tenant_and_the_worker_emits_them(
    stack: Stack, tmp_path: Path
) -> None:
    (tmp_path / "slow.yaml").write_text(SLOW_DEFINITION)
    env = _env(stack, tmp_path)
    settings = Settings.from_env(env)
    client = AgentqClient(settings=settings, sqs=stack.sqs, dynamodb=stack.dynamodb,
                          events=stack.events, s3=stack.s3)  # fmt: skip
    submitted = [
        client.submit(definition, dict(payload), tenant=tenant, priority=tier)
        for tenant, tier, definition, payload in TASKS
    ]
    worker = WorkerProcess("stats")
    # Leases long enough that a loaded machine's slow heartbeat does not fence tasks.
    worker.start({**env, **fast_env(MAX_CONCURRENT_CLAUDE="2", METRIC_TENANTS="tenant-a",
                                    VISIBILITY_EXTENSION_AMOUNT="8",
                                    VISIBILITY_EXTENSION_INTERVAL="500",
                                    TASK_DEFINITIONS_DIR=env["TASK_DEFINITIONS_DIR"])})  # fmt: skip
    try:
        wait_for(lambda: _ended(stack, submitted), timeout=180, interval=0.3,
                 message="every task ended")  # fmt: skip
    finally:
        worker.stop()  # SIGTERM: the worker sends its last events and metrics, then exits
    stored = store_events(stack)
    settle_indexes(stack)  # stats reads the events through the event-type index
    # An attempt the worker had to give up (a lease fenced on a loaded machine) is retried:
    # the retries the bus saw are the ones stats must count, per tier and per tenant.
    retried = [e for e in stored if e["detail-type"] == "Task Processing Failed"]
    retries_by_tier = Counter(str(e["payload"]["priority"]) for e in retried)
    retries_by_tenant = Counter(str(e["tenant"]) for e in retried)
    records = worker.log_records()

    ran = agentq({**os.environ, **env}, "stats", "--json", "--window", "15m")
    assert ran.code == 0, ran
    data = ran.json()
    assert data["version"] == 1 and data["windowS"] == 900 and data["truncated"] is False
    tiers = {row["tier"]: row for row in data["tiers"]}
    assert list(tiers) == ["high", "normal", "low"]
    endings = ("completions", "failures", "timeouts")
    assert {t: [tiers[t][f] for f in endings] for t in tiers} == {
        "high": [3, 1, 0],
        "normal": [0, 1, 0],
        "low": [2, 0, 1],
    }
    tenants = {row["tenant"]: row for row in data["tenants"]}
    assert {t: [tenants[t][f] for f in endings] for t in tenants} == {
        "tenant-a": [3, 1, 0],
        "tenant-b": [2, 1, 1],
    }
    assert {t: tiers[t]["retries"] for t in tiers} == {t: retries_by_tier[t] for t in tiers}
    assert {t: tenants[t]["retries"] for t in tenants} == {t: retries_by_tenant[t] for t in tenants}
    for row in [*tiers.values(), *tenants.values()]:
        # Every attempt started ends once: completed, failed, timed out or retried.
        assert row["claims"] == sum(row[f] for f in (*endings, "retries"))
        times = row["processingMs"]
        assert times["count"] == row["claims"], "every attempt that ended has a duration"
        assert times["p50"] is not None and times["p50"] <= times["p95"]
        assert row["running"] == 0 and row["waiting"] == 0
    assert tiers["low"]["processingMs"]["p95"] >= 1000, "the timed-out attempt ran its second"
    for row in tiers.values():
        assert (row["depth"], row["inFlight"], row["delayed"]) == (0, 0, 0)
        assert row["ageSource"] == "status-index" and row["oldestAgeS"] is None
    assert data["dlq"]["depth"] == 0
    # The worker stopped (SIGTERM above): no consumer now, and the list says it stopped.
    consumers = data["consumers"]
    assert (consumers["workers"], consumers["slots"], consumers["gone"]) == (0, 0, 0)
    (seen,) = consumers["list"]
    assert (seen["status"], seen["slots"]) == ("stopped", 2)
    # Three tier queues and the DLQ, five event types, four status shards twice, the roster.
    assert data["requests"] == 18

    # The count the command reports is the count of requests made.
    counter = CallCounter()
    reader = StatsReader(
        Settings.from_env(env),
        sqs=counter.attach(stack.aws_clients().sqs),
        dynamodb=counter.attach(stack.aws_clients().dynamodb),
    )
    again = reader.read(900)
    assert counter.total() == again["requests"] == 18
    assert again["tiers"][0]["claims"] == tiers["high"]["claims"]

    # The worker's own EMF lines: one set per tier, tenant-a by name, tenant-b as (other).
    # (TasksFailed counts a retried attempt too: an attempt failed either way.)
    by_tier = _emf(records, "tier")
    for tier, row in tiers.items():
        assert by_tier[(tier, "TasksStarted")] == row["claims"], tier
        assert by_tier[(tier, "TasksCompleted")] == row["completions"], tier
        assert by_tier[(tier, "TasksFailed")] == row["failures"] + row["retries"], tier
        assert by_tier[(tier, "TasksTimedOut")] == row["timeouts"], tier
    by_tenant = _emf(records, "tenant")
    assert by_tenant[("tenant-a", "TasksStarted")] == tenants["tenant-a"]["claims"]
    assert by_tenant[("tenant-a", "TasksCompleted")] == 3
    assert by_tenant[(OTHER_TENANTS, "TasksStarted")] == tenants["tenant-b"]["claims"]
    assert by_tenant[(OTHER_TENANTS, "TasksTimedOut")] == 1
    assert {value for value, _ in by_tenant} == {"tenant-a", OTHER_TENANTS}, (
        "a tenant not named in METRIC_TENANTS has no dimension value of its own"
    )
    tier_lines = [r for r in records if "tier" in r and "_aws" in r]
    assert tier_lines and all(r["stage"] == stack.resources.names.stage for r in tier_lines)
    last = {r["tier"]: r for r in tier_lines}
    assert sorted(last) == ["high", "low", "normal"]
    assert all(r["TasksInFlight"] == [0.0] for r in last.values()), "each gauge ends at 0"


def test_stats_refuses_a_bad_window_in_one_line(stack: Stack) -> None:
    ran = agentq({**os.environ, **stack.env()}, "stats", "--window", "15 minutes")
    assert ran.code == 6, ran
    assert "window" in one_line_error(ran)


def test_stats_without_a_stage_says_what_to_set(tmp_path: Path) -> None:
    ran = agentq(fresh_shell(), "stats", "--json", cwd=tmp_path)
    assert ran.code == 5, ran
    assert ran.json()["error"]["kind"] == "config"
    one_line_error(ran)


def test_stats_draws_its_tables_for_a_stage_with_nothing_done_yet(stack: Stack) -> None:
    ran = agentq({**os.environ, **stack.env(), "COLUMNS": "250"}, "stats", "--window", "5m")
    assert ran.code == 0, ran
    assert "per tier, last 5m" in ran.stdout and "per tenant, last 5m" in ran.stdout
    for tier in ("high", "normal", "low"):
        assert f"│ {tier} " in ran.stdout, tier
    assert "dead letters: 0 waiting, 0 in flight, oldest —" in ran.stdout
    assert "workers: 0 running (0 busy, 0 idle), 0 gone; 0 slot(s), 0 busy" in ran.stdout
    # In a terminal of 80 columns every header reads whole.
    narrow = agentq({**os.environ, **stack.env(), "COLUMNS": "80"}, "stats", "--window", "5m")
    for header in ("in flight", "delayed", "claimed", "retried", "timeouts", "p95 ms"):
        assert header in narrow.stdout, header
    assert "…" not in narrow.stdout, narrow.stdout
