"""Structured logs, EMF metrics and the middleware hooks around each task.

Powertools Metrics is made for Lambda (flush at the end of an invocation); in this
long-running process metrics are flushed after every task and at least once a minute,
as EMF JSON lines on stdout that the CloudWatch agent / awslogs driver ingests.

Three kinds of line (docs/operations.md, "Metrics"): the fleet's (`service`, `stage`:
what the alarms read), one per priority tier that saw work (`+ tier`), and one per
tenant group that saw work (`+ tenant`). Tiers are few and configured; tenants are
not, and every distinct dimension value is a billed custom metric, so only the tenants
named in METRIC_TENANTS get their own; the rest share one group, `(other)` (not a
valid tenant name, so it never collides with one). Every tenant's figures, named or
not, are in the events table, which `agentq stats` reads.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aws_lambda_powertools import Logger
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from agentq.aws import CallCounter

NAMESPACE: Final = "agentq"
SERVICE: Final = "worker"

PERIODIC_FLUSH_S: Final = 60.0
# The tenant group of every tenant not named in METRIC_TENANTS.
OTHER_TENANTS: Final = "(other)"
# EMF takes at most 100 values of one metric in one line.
MAX_VALUES: Final = 100

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
    tier: str | None = None  # the priority tier whose queue it came from
    lock_ms: int | None = None  # the lock's write (worker.settle.prepare)


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


# The count a task's end adds to (released, lease_lost, cancelled: none).
END_METRIC: Final[dict[str, str]] = {
    "completed": "TasksCompleted",
    "failed": "TasksFailed",
    "retrying": "TasksFailed",
    "timeout": "TasksTimedOut",
}


@dataclass
class GroupFigures:
    """One tier's or tenant group's figures since the last flush, and its tasks running."""

    counts: dict[str, int] = field(default_factory=dict)
    durations: list[int] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)
    locks: list[int] = field(default_factory=list)
    in_flight: int = 0
    active: bool = False  # something happened since the last flush

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        self.active = True


class MetricsMiddleware(Middleware):
    """TasksStarted/Completed/Failed/TimedOut, TaskDuration, QueueWait, LockLatency,
    SlotsBusy, Slots, AwsCalls for the fleet; per tier and tenant group the counts,
    TaskDuration, QueueWait, LockLatency and TasksInFlight."""

    def __init__(
        self,
        *,
        slots_busy: Any,
        counter: CallCounter | None,
        stage: str,
        write: Callable[[str], None] = write_line,
        slots: int | None = None,
        tiers: Sequence[str] = (),
        tenants: Collection[str] = (),
    ) -> None:
        # Its own metric set: Powertools' `Metrics` instances share one per process, and
        # nothing but this worker's figures may reach its lines.
        self._metrics = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
        # Alarms select their stage's metrics: a dev stage must not trip prod's alarms.
        self._metrics.set_default_dimensions(stage=stage)
        self._stage = stage
        self._write = write
        self._slots_busy = slots_busy
        self._slots = slots
        self._counter = counter
        self._named_tenants = frozenset(tenants)
        self._lock = threading.Lock()
        self._calls_reported = 0
        self._flushed_at = time.monotonic()
        # (dimension, value) -> figures; configured tiers first, so their lines come in
        # priority order.
        self._groups: dict[tuple[str, str], GroupFigures] = {
            ("tier", tier): GroupFigures() for tier in tiers
        }

    def tenant_group(self, tenant: str) -> str:
        return tenant if tenant in self._named_tenants else OTHER_TENANTS

    def _groups_of(self, start: TaskStart) -> list[GroupFigures]:
        keys = [("tier", start.tier)] if start.tier else []
        if self._named_tenants:
            # Without named tenants the one group would repeat the fleet's line.
            keys.append(("tenant", self.tenant_group(start.tenant)))
        return [self._groups.setdefault(key, GroupFigures()) for key in keys]

    def before_process(self, start: TaskStart) -> None:
        with self._lock:
            self._metrics.add_metric(name="TasksStarted", unit=MetricUnit.Count, value=1)
            if start.queue_wait_ms is not None:
                self._metrics.add_metric(
                    name="QueueWait", unit=MetricUnit.Milliseconds, value=start.queue_wait_ms
                )
            if start.lock_ms is not None:
                self._metrics.add_metric(
                    name="LockLatency", unit=MetricUnit.Milliseconds, value=start.lock_ms
                )
            for group in self._groups_of(start):
                group.count("TasksStarted")
                group.in_flight += 1
                if start.queue_wait_ms is not None:
                    group.waits.append(start.queue_wait_ms)
                if start.lock_ms is not None:
                    group.locks.append(start.lock_ms)

    def after_process(self, end: TaskEnd) -> None:
        name = END_METRIC.get(end.result)
        with self._lock:
            if name is not None:
                self._metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
            self._metrics.add_metric(
                name="TaskDuration", unit=MetricUnit.Milliseconds, value=end.duration_ms
            )
            for group in self._groups_of(end.start):
                group.active = True
                group.in_flight = max(0, group.in_flight - 1)
                group.durations.append(end.duration_ms)
                if name is not None:
                    group.count(name)
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
            if self._slots is not None:
                self._metrics.add_metric(name="Slots", unit=MetricUnit.Count, value=self._slots)
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
                for (dimension, value), group in self._groups.items():
                    if group.active or group.in_flight:
                        self._write(self._group_line(dimension, value, group))
            self._metrics.clear_metrics()
            for group in self._groups.values():
                group.counts.clear()
                group.durations.clear()
                group.waits.clear()
                group.locks.clear()
                group.active = False

    def _group_line(self, dimension: str, value: str, group: GroupFigures) -> str:
        line = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
        line.set_default_dimensions(stage=self._stage, **{dimension: value})
        for name, count in group.counts.items():
            line.add_metric(name=name, unit=MetricUnit.Count, value=count)
        for name, values in (("TaskDuration", group.durations), ("QueueWait", group.waits),
                             ("LockLatency", group.locks)):  # fmt: skip
            for one in values[-MAX_VALUES:]:
                line.add_metric(name=name, unit=MetricUnit.Milliseconds, value=one)
        # A gauge, sent while tasks run and once more when they end, so it returns to 0.
        line.add_metric(name="TasksInFlight", unit=MetricUnit.Count, value=group.in_flight)
        return json.dumps(line.serialize_metric_set(), separators=(",", ":"))
