"""Structured logs, EMF metrics and the middleware hooks around each task.

Powertools Metrics is made for Lambda (flush at the end of an invocation); in this
long-running process metrics are flushed after every task and at least once a minute,
as EMF JSON lines on stdout that the CloudWatch agent / awslogs driver ingests.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from agentq.aws import CallCounter

NAMESPACE: Final = "agentq"
SERVICE: Final = "worker"

PERIODIC_FLUSH_S: Final = 60.0

Result = Literal[
    "completed", "failed", "retrying", "timeout", "released", "lease_lost", "cancelled"
]


def make_logger(level: str) -> Logger:
    logger = Logger(service=SERVICE, level=level.upper())
    # Route the worker's module loggers (logging.getLogger("worker.*")) through the
    # same JSON handler.
    for name in ("worker", "agentq"):
        std = logging.getLogger(name)
        std.handlers = logger.handlers
        std.setLevel(level.upper())
        std.propagate = False
    return logger


def write_line(line: str) -> None:
    """One whole line on stdout that no log record can split.

    Log records are written under their handler's lock, from many threads; Powertools'
    `flush_metrics` prints, and `print` writes the line and its newline in two calls, so
    a record could land between them and glue itself to an EMF line (seen in a test:
    both lines lost to a JSON parser, as they would be to CloudWatch)."""
    handlers = logging.getLogger("worker").handlers
    handler = next((h for h in handlers if isinstance(h, logging.StreamHandler)), None)
    if handler is None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return
    with handler.lock or threading.RLock():
        handler.stream.write(line + "\n")
        handler.flush()


@dataclass(frozen=True, kw_only=True)
class TaskStart:
    request_id: str
    tenant: str
    definition: str
    attempt: int
    queue_wait_ms: int | None


@dataclass(frozen=True, kw_only=True)
class TaskEnd:
    start: TaskStart
    result: Result
    duration_ms: int


class Middleware:
    """Cross-cutting concerns around each task attempt (dramatiq-style hooks)."""

    def before_process(self, start: TaskStart) -> None:
        """Called in the slot thread once the lock is held, before the child starts."""

    def after_process(self, end: TaskEnd) -> None:
        """Called in the slot thread after the message is settled, whatever happened."""


class MetricsMiddleware(Middleware):
    """TasksStarted/Completed/Failed/TimedOut, TaskDuration, QueueWait, SlotsBusy, AwsCalls."""

    def __init__(
        self,
        *,
        slots_busy: Any,
        counter: CallCounter | None,
        stage: str,
        write: Callable[[str], None] = write_line,
    ) -> None:
        self._metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
        # Alarms select their stage's metrics: a dev stage must not trip prod's alarms.
        self._metrics.set_default_dimensions(stage=stage)
        self._write = write
        self._slots_busy = slots_busy
        self._counter = counter
        self._lock = threading.Lock()
        self._calls_reported = 0
        self._flushed_at = time.monotonic()

    def before_process(self, start: TaskStart) -> None:
        with self._lock:
            self._metrics.add_metric(name="TasksStarted", unit=MetricUnit.Count, value=1)
            if start.queue_wait_ms is not None:
                self._metrics.add_metric(
                    name="QueueWait", unit=MetricUnit.Milliseconds, value=start.queue_wait_ms
                )

    def after_process(self, end: TaskEnd) -> None:
        name = {
            "completed": "TasksCompleted",
            "failed": "TasksFailed",
            "retrying": "TasksFailed",
            "timeout": "TasksTimedOut",
        }.get(end.result)
        with self._lock:
            if name is not None:
                self._metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
            self._metrics.add_metric(
                name="TaskDuration", unit=MetricUnit.Milliseconds, value=end.duration_ms
            )
        self.flush()

    def tick(self) -> None:
        """Flush now and then while long tasks run, so SlotsBusy is never stale."""
        if time.monotonic() - self._flushed_at >= PERIODIC_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            self._flushed_at = time.monotonic()
            self._metrics.add_metric(
                name="SlotsBusy", unit=MetricUnit.Count, value=float(self._slots_busy())
            )
            if self._counter is not None:
                total = self._counter.total()
                self._metrics.add_metric(
                    name="AwsCalls", unit=MetricUnit.Count, value=total - self._calls_reported
                )
                self._calls_reported = total
            # What `flush_metrics` does, with one atomic line instead of `print`.
            if not is_metrics_disabled():
                payload = self._metrics.serialize_metric_set()
                self._write(json.dumps(payload, separators=(",", ":")))
            self._metrics.clear_metrics()
