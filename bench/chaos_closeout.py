"""Dead-letter close-outs in a --faults chaos run, with the event's publish failing.

A close-out (agentq/dlq/processor.py) needs a task whose every attempt *and* receive
were spent, which kills rarely line up; so "phantom holders" take a few tasks' leases
through the real lock (`TaskStore.acquire`), one attempt after another, each left to
lapse as a crashed worker's would, and the harness moves the message to the DLQ. The
DLQ processor closes the task out FAILED while its `PutEvents` meets aimed server
errors (`closeout_rules`), so its first publish fails and the Lambda is retried.

The invariant: each close-out task is FAILED with exactly one stored `Task Failed`
(the retry re-sent the stored event) and its job, if any, closed. When the host's
backlog keeps the dead letter waiting past the reconciler's bound, the reconciler
re-sends the task and a worker's lock finds no attempt left: counted apart.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.dlq import DlqArchive
from agentq.envelope import TaskEnvelope
from agentq.jobs.store import JobStore
from agentq.store.events import EventStore
from agentq.store.tasks import TaskStore
from bench.chaos_model import TERMINAL_EVENTS, ChaosReport
from bench.stack import Stage, envelope

CLOSEOUT_PREFIX: Final = "chaos-closeout-"
CLOSEOUT_TASKS: Final = 2
# botocore's attempts per call (agentq.aws.make_client): one failed publish spends them.
_BOTOCORE_ATTEMPTS: Final = 5
PHANTOM: Final = "phantom"
PHANTOM_LEASE_S: Final = 0.3
VIOLATION: Final = "DLQ close-outs without exactly one stored Task Failed"
# The DLQ processor's reason, and a worker's lock refused for want of attempts.
BY_DLQ: Final = "dlq"
BY_WORKER: Final = "attempts exhausted"
CLOSERS: Final = (BY_DLQ, BY_WORKER)


def closeout_rules(count: int = CLOSEOUT_TASKS) -> list[dict[str, Any]]:
    """Every PutEvents naming a close-out task fails (a 500, each botocore retry too)
    until `count` publishes' worth are spent: the first close-out's publish fails for
    sure, and a retry of the Lambda must send the event it stored."""
    return [{"op": "events:PutEvents", "kind": "server_error", "rate": 1.0,
             "match": CLOSEOUT_PREFIX, "limit": _BOTOCORE_ATTEMPTS * count}]  # fmt: skip


def plan_closeouts(count: int, rng: random.Random, side_log: Path) -> list[TaskEnvelope]:
    return [
        envelope("bench-work", {"side_log": str(side_log), "seconds": rng.uniform(0.1, 0.5)},
                 request_id=f"{CLOSEOUT_PREFIX}{uuid.uuid4().hex[:12]}")
        for _ in range(count)
    ]  # fmt: skip


class Closeouts:
    """Spends the planned tasks' attempts as phantom holders, then dead-letters them."""

    def __init__(self, stage: Stage, planned: Sequence[TaskEnvelope], max_attempts: int) -> None:
        self.planned = list(planned)
        self._stage = stage
        self._max_attempts = max_attempts
        self.attempts_spent = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="closeouts", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float = 60.0) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.errors.append("close-outs: the phantom holders did not finish")

    def _run(self) -> None:
        try:
            self._spend_and_dead_letter()
        except Exception as exc:  # the run goes on; the report shows it
            self.errors.append(f"close-outs: {exc!r}")

    def _spend_and_dead_letter(self) -> None:
        if not self.planned:
            return
        # The harness's own (fault-free) clients: the phantoms are not under test.
        store = TaskStore(self._stage.clients["dynamodb"], self._stage.resources.table_name)
        for task in self.planned:
            store.create(task)
        for _ in range(self._max_attempts):
            for task in self.planned:
                store.acquire(task, worker_id=PHANTOM, lease_seconds=PHANTOM_LEASE_S,
                              max_attempts=self._max_attempts)  # fmt: skip
                self.attempts_spent += 1
            time.sleep(PHANTOM_LEASE_S + 0.3)  # each lease lapses, as a crashed holder's
        for task in self.planned:
            self._stage.sqs.send_message(QueueUrl=self._stage.resources.dlq_url,
                                         MessageBody=task.to_body(),
                                         MessageAttributes=task.message_attributes())  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CloseoutSeen:
    """What the run left of one close-out task."""

    request_id: str
    state: str | None  # the STATE item's, None if it has none
    closed_by: str | None  # its error's reason: "dlq" or "attempts exhausted" (a worker)
    terminal_events: tuple[str, ...]  # stored terminal events' detail types
    job_id: str | None = None
    job_state: str | None = None


def closeout_violations(seen: Sequence[CloseoutSeen]) -> list[str]:
    """Each close-out task FAILED by the DLQ with exactly one stored `Task Failed`, and
    its job (if any) closed."""
    violations = []
    for task in seen:
        problems = []
        if task.state != "FAILED" or task.closed_by not in CLOSERS:
            problems.append(f"state {task.state} (closed by {task.closed_by})")
        if list(task.terminal_events) != ["Task Failed"]:
            problems.append(f"stored terminal events {list(task.terminal_events)}")
        if task.job_id is not None and task.job_state in (None, "RUNNING"):
            problems.append(f"job {task.job_id} left {task.job_state}")
        if problems:
            violations.append(f"{VIOLATION}: {task.request_id}: {'; '.join(problems)}")
    return violations


def closer_of(item: Mapping[str, Any]) -> str | None:
    """Who failed it: the DLQ processor says so in the error, a worker's refused lock
    beside it (agentq/dlq/processor.py, worker/settle/refusals.py)."""
    error = item.get("error")
    if isinstance(error, Mapping) and error.get("reason") == BY_DLQ:
        return BY_DLQ
    reason = item.get("reason")
    return str(reason) if reason is not None else None


def verify_closeouts(stage: Stage, closeouts: Closeouts, report: ChaosReport) -> None:
    ddb = stage.clients["dynamodb"]
    tasks = TaskStore(ddb, stage.resources.table_name)
    events = EventStore(ddb, stage.resources.table_name, app_name=stage.resources.names.app_name)
    jobs = JobStore(ddb, stage.resources.table_name)
    archive = DlqArchive(stage.clients["s3"], stage.resources.bucket)
    retried = 0
    seen = []
    for task in closeouts.planned:
        record = tasks.get(task.tenant, task.request_id)
        job = jobs.get(task.tenant, record.job_id) if record and record.job_id else None
        timeline = events.timeline(task.tenant, task.request_id)
        # Closed out, its publish failed, and the Lambda's retry found the task FAILED.
        outcomes = [m.outcome for m in archive.list(request_id=task.request_id)]
        retried += "already-terminal" in outcomes
        seen.append(CloseoutSeen(
            request_id=task.request_id,
            state=record.state.value if record else None,
            closed_by=closer_of(record.raw if record else {}),
            terminal_events=tuple(e["detailType"] for e in timeline
                                  if e.get("detailType") in TERMINAL_EVENTS),
            job_id=record.job_id if record else None,
            job_state=str(getattr(job.state, "value", job.state)) if job else None,
        ))  # fmt: skip
    found = closeout_violations(seen)
    report.closeouts = len(seen)
    report.closeouts_bad = len(found)
    report.closeouts_retried = retried
    report.closeouts_by_worker = sum(task.closed_by == BY_WORKER for task in seen)
    report.violations.extend([*closeouts.errors, *found])
