"""The worker's EMF metric lines: complete, and never split by a log record."""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any

import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from worker.telemetry import OTHER_TENANTS, MetricsMiddleware, TaskEnd, TaskStart, write_line


def _metric_names(line: str) -> set[str]:
    payload = json.loads(line)
    return {m["Name"] for m in payload["_aws"]["CloudWatchMetrics"][0]["Metrics"]}


def test_a_flush_writes_one_emf_line_and_starts_afresh() -> None:
    lines: list[str] = []
    metrics = MetricsMiddleware(slots_busy=lambda: 3, counter=None, stage="qa", write=lines.append)
    start = TaskStart(request_id="r-1", tenant="t", definition="d", attempt=1, queue_wait_ms=40)
    metrics.before_process(start)
    metrics.after_process(TaskEnd(start=start, result="completed", duration_ms=120))
    assert len(lines) == 1 and "\n" not in lines[0]
    assert _metric_names(lines[0]) == {
        "TasksStarted",
        "QueueWait",
        "TasksCompleted",
        "TaskDuration",
        "SlotsBusy",
    }
    assert json.loads(lines[0])["SlotsBusy"] == [3.0]
    # Every metric carries its stage, so each stage's alarms see only their own.
    (dimensions,) = json.loads(lines[0])["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
    assert set(dimensions) == {"service", "stage"}
    assert json.loads(lines[0])["stage"] == "qa"
    metrics.flush()
    assert _metric_names(lines[1]) == {"SlotsBusy"}, "what was flushed is not sent again"
    assert json.loads(lines[1])["stage"] == "qa", "the stage outlives a flush"


def test_a_metric_another_component_left_unflushed_never_reaches_the_workers_line() -> None:
    # Powertools' `Metrics` instances share one metric set per process (a Lambda's, here).
    lambdas = Metrics(namespace="agentq", service="agentq-save-event")
    lambdas.add_metric(name="EventsStored", unit=MetricUnit.Count, value=1)
    try:
        lines: list[str] = []
        metrics = MetricsMiddleware(
            slots_busy=lambda: 0, counter=None, stage="qa", write=lines.append
        )
        metrics.flush()
        assert _metric_names(lines[0]) == {"SlotsBusy"}
    finally:
        lambdas.clear_metrics()


class _ProbingStream(io.StringIO):
    """Records, for each write, whether another thread could take the handler's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.handler: logging.Handler | None = None
        self.lock_free_during_write: list[bool] = []

    def write(self, text: str) -> int:
        assert self.handler is not None and self.handler.lock is not None
        lock = self.handler.lock
        taken: list[bool] = []

        def probe() -> None:
            got = lock.acquire(blocking=False)
            taken.append(got)
            if got:
                lock.release()

        prober = threading.Thread(target=probe)
        prober.start()
        prober.join(timeout=10)
        self.lock_free_during_write.append(taken == [True])
        return super().write(text)


def test_a_metric_line_is_written_under_the_log_handlers_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = _ProbingStream()
    handler = logging.StreamHandler(stream)
    stream.handler = handler
    monkeypatch.setattr(logging.getLogger("worker"), "handlers", [handler])
    write_line('{"_aws":{}}')
    assert stream.getvalue() == '{"_aws":{}}\n'
    # Held through the write: a log record from another thread waits until the line ends.
    assert stream.lock_free_during_write == [False]


def test_without_a_log_handler_the_line_goes_to_stdout_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[Any]
) -> None:
    monkeypatch.setattr(logging.getLogger("worker"), "handlers", [])
    write_line('{"_aws":{}}')
    assert capsys.readouterr().out == '{"_aws":{}}\n'


def _lines_by(lines: list[str], dimension: str) -> dict[str, dict[str, Any]]:
    """The last line for each value of `dimension` (lines without it left out)."""
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        payload = json.loads(line)
        if dimension in payload:
            (dimensions,) = payload["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
            assert set(dimensions) == {"service", "stage", dimension}
            assert payload["stage"] == "qa"
            found[payload[dimension]] = payload
    return found


def test_tiers_and_named_tenants_get_their_own_lines_and_the_rest_share_one() -> None:
    lines: list[str] = []
    metrics = MetricsMiddleware(slots_busy=lambda: 1, counter=None, stage="qa",
                                write=lines.append, slots=4, tiers=("high", "low"),
                                tenants=("acme",))  # fmt: skip
    first = TaskStart(request_id="r-1", tenant="acme", definition="d", attempt=1,
                      queue_wait_ms=5, tier="high")  # fmt: skip
    second = TaskStart(request_id="r-2", tenant="globex", definition="d", attempt=1,
                       queue_wait_ms=None, tier="low")  # fmt: skip
    metrics.before_process(first)
    metrics.before_process(second)
    metrics.after_process(TaskEnd(start=first, result="failed", duration_ms=70))
    tiers = _lines_by(lines, "tier")
    assert tiers["high"]["TasksStarted"] == [1.0] and tiers["high"]["TasksFailed"] == [1.0]
    assert tiers["high"]["TaskDuration"] == [70.0] and tiers["high"]["TasksInFlight"] == [0.0]
    assert tiers["low"]["TasksInFlight"] == [1.0], "a tier with a running task reports it"
    tenants = _lines_by(lines, "tenant")
    assert set(tenants) == {"acme", OTHER_TENANTS}, "globex is not named: it is (other)"
    assert json.loads(lines[0])["Slots"] == [4.0]
    lines.clear()
    metrics.after_process(TaskEnd(start=second, result="timeout", duration_ms=900))
    assert set(_lines_by(lines, "tier")) == {"low"}, "a quiet tier sends nothing"
    assert _lines_by(lines, "tier")["low"]["TasksTimedOut"] == [1.0]
    assert _lines_by(lines, "tenant")[OTHER_TENANTS]["TasksInFlight"] == [0.0]


def test_without_named_tenants_there_are_no_tenant_lines() -> None:
    lines: list[str] = []
    metrics = MetricsMiddleware(slots_busy=lambda: 0, counter=None, stage="qa",
                                write=lines.append, tiers=("normal",))  # fmt: skip
    start = TaskStart(request_id="r-1", tenant="acme", definition="d", attempt=1,
                      queue_wait_ms=1, tier="normal")  # fmt: skip
    metrics.before_process(start)
    metrics.after_process(TaskEnd(start=start, result="completed", duration_ms=3))
    assert _lines_by(lines, "tenant") == {}
    assert _lines_by(lines, "tier")["normal"]["TasksCompleted"] == [1.0]


def test_the_locks_write_time_is_reported_for_the_fleet_and_its_tier() -> None:
    lines: list[str] = []
    metrics = MetricsMiddleware(slots_busy=lambda: 2, counter=None, stage="qa",
                                write=lines.append, tiers=("high", "low"))  # fmt: skip
    fast = TaskStart(request_id="r-1", tenant="acme", definition="d", attempt=1,
                     queue_wait_ms=50, tier="high", lock_ms=12)  # fmt: skip
    slow = TaskStart(request_id="r-2", tenant="acme", definition="d", attempt=1,
                     queue_wait_ms=400, tier="low", lock_ms=340)  # fmt: skip
    unknown = TaskStart(request_id="r-3", tenant="acme", definition="d", attempt=1,
                        queue_wait_ms=9, tier="high")  # fmt: skip
    for start in (fast, slow, unknown):
        metrics.before_process(start)
    metrics.after_process(TaskEnd(start=fast, result="completed", duration_ms=30))
    fleet = json.loads(lines[0])
    assert sorted(fleet["LockLatency"]) == [12.0, 340.0], "a start without a lock time adds none"
    tiers = _lines_by(lines, "tier")
    assert tiers["high"]["LockLatency"] == [12.0] and tiers["low"]["LockLatency"] == [340.0]
    lines.clear()
    metrics.after_process(TaskEnd(start=slow, result="completed", duration_ms=30))
    assert "LockLatency" not in json.loads(lines[0]), "what was flushed is not sent again"
    assert "LockLatency" not in _lines_by(lines, "tier")["low"]
