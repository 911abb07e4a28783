"""The reconciler: repairs what no event will ever fix (see docs/operations.md).

`Reconciler.run()` is one sweep; the reconciler Lambda runs it on a schedule and the
local Lambda host on a timer. Everything it reads comes from the status index, never a
scan, and both passes (lost messages, stalled jobs) read through cursors that move, a
bounded page per partition and run (agentq.reconcile.cursor); every repair is claimed or conditional, so overlapping or repeated runs repair a
situation once; every repair is published as a `Task Repaired` / `Job Repaired` event.
"""

from __future__ import annotations

from typing import Any

from agentq.config import Settings
from agentq.events import now_ms
from agentq.jobs.dispatch import JobDispatcher
from agentq.jobs.store import JobStore
from agentq.publisher import EventPublisher
from agentq.reconcile.jobs import StalledJobs, stall_reason
from agentq.reconcile.messages import LostMessages
from agentq.reconcile.model import (
    RECONCILER_TRIGGER,
    REPAIR_KINDS,
    ReconcileReport,
    Repair,
    RepairKind,
)
from agentq.store import TaskStore

__all__ = [
    "RECONCILER_TRIGGER",
    "REPAIR_KINDS",
    "LostMessages",
    "ReconcileReport",
    "Reconciler",
    "Repair",
    "RepairKind",
    "StalledJobs",
    "stall_reason",
]


class Reconciler:
    def __init__(
        self,
        *,
        settings: Settings,
        tasks: TaskStore,
        jobs: JobStore,
        dispatcher: JobDispatcher,
        publisher: EventPublisher,
        dynamodb: Any,
        sqs: Any,
    ) -> None:
        table = settings.required("table_name")
        self.messages = LostMessages(
            tasks=tasks,
            dynamodb=dynamodb,
            table_name=table,
            sqs=sqs,
            queue_url=settings.required("queue_url"),
            publisher=publisher,
            lost_after_s=settings.reconcile_lost_after_s,
            page_size=settings.reconcile_page_size,
        )
        self.jobs = StalledJobs(
            jobs=jobs,
            tasks=tasks,
            dispatcher=dispatcher,
            publisher=publisher,
            dynamodb=dynamodb,
            table_name=table,
            stall_after_s=settings.reconcile_stall_after_s,
            page_size=settings.reconcile_page_size,
        )

    def run(self, *, at_ms: int | None = None) -> ReconcileReport:
        report = ReconcileReport(checked_at_ms=now_ms() if at_ms is None else at_ms)
        # Jobs first: a stalled job's repair may unblock tasks, which then must not
        # look like lost messages to this same sweep (they are fresh).
        self.jobs.run(report.checked_at_ms, report.repairs, report.errors)
        self.messages.run(report.checked_at_ms, report.repairs, report.errors)
        return report
