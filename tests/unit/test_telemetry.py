"""The worker's EMF metric lines: complete, and never split by a log record."""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any

import pytest

from worker.telemetry import MetricsMiddleware, TaskEnd, TaskStart, write_line


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
