"""The benchmarks' code paths on tiny sizes: every figure is computed (not its speed)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from agentq.local.aws import MotoServer
from bench import lambda_import, latency, memory, report, requests_per_task, saturation, throughput

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_bench_smoke_requests_per_task_solves_both_costs(moto_server: MotoServer) -> None:
    result = requests_per_task.run(moto_server, tasks=6, long=(2, 1.2))
    assert result["runs"]["no-op"]["calls"]["sqs:ReceiveMessage"] >= 1
    assert result["runs"]["long"]["heartbeats"] > 0, result["runs"]["long"]
    assert result["per_task"] > 0 and result["per_heartbeat"] > 0
    assert result["seed_per_task"] == 6 and result["seed_per_heartbeat"] == 2
    # The heartbeat's own calls, per beat: one visibility batch and at most one lease
    # transaction for the messages it holds (one queue here), nothing per task.
    beat = result["heartbeat"]
    assert beat["beats"] > 0 and 0 < beat["held_per_beat"] <= 2, beat
    per_beat = beat["calls_per_beat"]
    assert set(per_beat) <= {"sqs:ChangeMessageVisibilityBatch", "dynamodb:TransactWriteItems"}
    assert 0 < per_beat["sqs:ChangeMessageVisibilityBatch"] <= 1, beat
    assert per_beat.get("dynamodb:TransactWriteItems", 0) <= 1, beat
    assert 0 < beat["put_events_per_event"] <= 1 and beat["per_task_interval"] > 0, beat
    assert requests_per_task.seed_cost(200, 30) == 200 * 6 + 30 * 2
    assert report.table("requests_per_task", result) is not None


def test_bench_smoke_saturation_measures_both_loops(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    durations = saturation._durations(4, True, random.Random(1))
    for loop in (saturation.agentq_run, saturation.baseline_run):
        figures = loop(moto_server, durations, tmp_path)
        assert figures["makespan_s"] > 0 and figures["ideal_measured_s"] > 0
        assert math.isfinite(figures["ratio"]), figures


def test_bench_smoke_latency_throughput_memory_and_imports(moto_server: MotoServer) -> None:
    lat = latency.run(moto_server, quick=True, rounds=3, concurrencies=(1,))
    assert lat["concurrency_1"]["samples"] == 3
    for key in ("visible_to_child_started", "child_exit_to_deleted"):
        assert lat["concurrency_1"][key]["p50_ms"] > 0
    assert lat["floor_ms"]["dispatch_floor"] > 0 and lat["floor_ms"]["settle_floor"] > 0

    tp = throughput.run(moto_server, tasks=4, worker_counts=(1,))
    assert tp["raw_tasks_per_s"] > 0 and tp["workers"][0]["tasks_per_s"] > 0

    mem = memory.run(moto_server, task_seconds=3.5)
    assert mem["worker_idle_mb"] > 10 and mem["python_child_mb"] > 5

    ms, heaviest = lambda_import.import_ms("lambdas.save_event")
    assert ms > 0 and heaviest
    assert "lambdas.save_event" in lambda_import.handler_modules()
    results = {"latency": lat, "throughput": tp, "memory": mem}
    for name, data in results.items():
        assert not isinstance(report.table(name, data), str), name
