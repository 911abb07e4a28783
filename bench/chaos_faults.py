"""The verdict of a --faults chaos run, beyond the invariants every run checks.

Checked from the STATE items, the events table, S3 and the fault log after the run:

- no task lost: every task, independent or of a job, is terminal;
- exactly one stored terminal event per task (a missing one is a violation here, not
  a finding: with faults the promise includes the event);
- no job left open, and each closed the right way: COMPLETED exactly when all its
  tasks completed, one `Job Completed`/`Job Failed` event, no task completed whose
  dependencies did not;
- each completed task's result object is the one its winning attempt wrote: the
  STATE item names the attempt, and bench.tasks writes the attempt into its result;
- no task dead-lettered while it had attempts left;
- every job task the dispatcher moved out of BLOCKED was sent by that dispatch;
- job tasks' executions do not overlap beyond the skew budget (independent tasks are
  checked by bench.chaos_verify);
- the reconciler's repairs and the injected faults, counted by kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentq.errors import AgentqError
from agentq.faults.log import read_counts
from agentq.jobs import ResultReader, task_request_id
from agentq.jobs.store import JobStore
from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from agentq.store.events import EventStore
from agentq.store.tasks import TaskRecord, TaskStore
from bench.chaos_executions import executions_of, fenced_children, frozen_windows, overlap_s
from bench.chaos_model import TERMINAL_EVENTS, ChaosReport, Freeze, Kill, Planned, PlannedJob
from bench.stack import Stage

_JOB_CLOSE_EVENTS = ("Job Completed", "Job Failed")


def verify_faults(
    stage: Stage,
    planned: Sequence[Planned],
    jobs: Sequence[PlannedJob],
    side_log: Sequence[Mapping[str, Any]],
    kills: Sequence[Kill],
    freezes: Sequence[Freeze],
    fleet: Sequence[WorkerProcess],
    report: ChaosReport,
    *,
    fault_log: Path,
    max_attempts: int,
) -> None:
    ddb = stage.clients["dynamodb"]
    table = stage.resources.table_name
    tasks = TaskStore(ddb, table)
    events = EventStore(ddb, table, app_name=stage.resources.names.app_name)
    results = ResultReader(stage.clients["s3"], stage.resources.bucket)
    runs = executions_of(side_log, kills, fenced_children(fleet), freezes)
    frozen = frozen_windows(freezes)
    checker = _Checker(tasks, events, results, report, max_attempts)
    for item in planned:
        checker.task(item.envelope.tenant, item.envelope.request_id, item.kind)
    jobs_store = JobStore(ddb, table)
    for job in jobs:
        states: dict[str, TaskRecord | None] = {}
        for key, kind in job.kinds.items():
            rid = task_request_id(job.job_id, key)
            states[key] = checker.task(job.tenant, rid, kind, job_id=job.job_id)
            _overlaps(rid, runs.get(rid, []), frozen, report)
        _check_job(job, states, jobs_store, events, report)
        _check_dispatched(job, states, report)
    report.repairs = _repairs(events)
    if fault_log.exists():
        by_kind: Counter[str] = Counter()
        for key, count in read_counts(str(fault_log)).items():
            by_kind[key.rsplit(":", 1)[-1]] += count
        report.faults = dict(by_kind)


class _Checker:
    def __init__(
        self,
        tasks: TaskStore,
        events: EventStore,
        results: ResultReader,
        report: ChaosReport,
        max_attempts: int,
    ) -> None:
        self._tasks = tasks
        self._events = events
        self._results = results
        self._report = report
        self._max_attempts = max_attempts

    def task(
        self, tenant: str, rid: str, kind: str, *, job_id: str | None = None
    ) -> TaskRecord | None:
        report, where = self._report, f"{rid} ({kind}{', job ' + job_id if job_id else ''})"
        record = self._tasks.get(tenant, rid)
        if record is None or not record.state.terminal:
            report.tasks_lost += 1
            if job_id:  # independent tasks are reported by bench.chaos_verify
                report.violations.append(f"{where}: not terminal: {record and record.state}")
            return record
        timeline = self._events.timeline(tenant, rid)
        terminal = [e for e in timeline if e.get("detailType") in TERMINAL_EVENTS]
        if len(terminal) != 1 and (job_id or not terminal):
            # (More than one, for an independent task, bench.chaos_verify reports.)
            report.violations.append(
                f"{where}: {record.state.value} with {len(terminal)} stored terminal events"
            )
        # The task's own budget, as its lock recorded it (a one-attempt task has 1), and
        # one more for each attempt a drain released (agentq.store.records).
        budget = record.raw.get("maxAttempts")
        limit = record.attempt_budget(budget if isinstance(budget, int) else self._max_attempts)
        if _dead_lettered(record) and record.attempt < limit:
            report.dead_lettered_with_attempts += 1
            report.violations.append(
                f"{where}: dead-lettered FAILED after {record.attempt} of {limit} attempts"
            )
        if record.state is TaskState.COMPLETED:
            self._result(record, where)
        return record

    def _result(self, record: TaskRecord, where: str) -> None:
        report = self._report
        try:
            result = self._results.load(record)
        except AgentqError as error:
            report.results_checked += 1
            report.results_mismatched += 1
            report.violations.append(f"{where}: COMPLETED, its result unreadable: {error}")
            return
        written_by = result.get("attempt") if isinstance(result, Mapping) else None
        if not isinstance(written_by, int):
            report.results_unchecked += 1
            return
        report.results_checked += 1
        if written_by != record.attempt:
            report.results_mismatched += 1
            report.violations.append(
                f"{where}: COMPLETED by attempt {record.attempt}, but its result object "
                f"({self._results.pointer(record)[1]}) was written by attempt {written_by}"
            )


def _check_job(
    job: PlannedJob,
    states: Mapping[str, TaskRecord | None],
    jobs: JobStore,
    events: EventStore,
    report: ChaosReport,
) -> None:
    record = jobs.get(job.tenant, job.job_id)
    if record is None or record.state == "RUNNING":
        report.jobs_open += 1
        left = sorted(k for k, r in states.items() if r is None or not r.state.terminal)
        report.violations.append(f"job {job.job_id}: left open (tasks not terminal: {left})")
        return
    all_done = all(r is not None and r.state is TaskState.COMPLETED for r in states.values())
    problems = []
    if (record.state == "COMPLETED") != all_done:
        problems.append(f"closed {record.state} with tasks {_states(states)}")
    closes = [e for e in events.job_timeline(job.tenant, job.job_id)
              if e.get("detailType") in _JOB_CLOSE_EVENTS]  # fmt: skip
    if len(closes) != 1:
        problems.append(f"{len(closes)} close events")
    spec_tasks: Mapping[str, Any] = job.spec["tasks"]
    for key, task in spec_tasks.items():
        state = states.get(key)
        if state is not None and state.state is TaskState.COMPLETED:
            early = [d for d in task.get("depends_on", [])
                     if (dep := states.get(d)) is None or dep.state is not TaskState.COMPLETED]  # fmt: skip
            if early:
                problems.append(f"{key} completed though {early} did not")
        completed = state is not None and state.state is TaskState.COMPLETED
        if job.kinds.get(key) == "permanent" and completed:
            problems.append(f"{key} meant to fail, COMPLETED")
    problems += _upstream_mismatches(states)
    if problems:
        report.jobs_bad_close += 1
        report.violations.append(f"job {job.job_id}: {'; '.join(problems)}")


def _check_dispatched(
    job: PlannedJob, states: Mapping[str, TaskRecord | None], report: ChaosReport
) -> None:
    """The invocation whose write moved a task out of BLOCKED (`enqueuedBy`) sends its
    message and marks it (`sentAt`), even when that write was applied and retried. A
    reconciler's re-send repairs a message never sent without marking it: such a task
    still ends, and only this check sees that the dispatch itself failed."""
    for key, record in states.items():
        if record is not None and record.raw.get("enqueuedBy") and "sentAt" not in record.raw:
            report.dispatched_unsent += 1
            report.violations.append(
                f"job {job.job_id}: {key} moved out of BLOCKED by "
                f"{record.raw['enqueuedBy']}, its message never sent by that dispatch"
            )


def _upstream_mismatches(states: Mapping[str, TaskRecord | None]) -> list[str]:
    """Parts whose input holds a split result other than the winning attempt's."""
    split = states.get("split")
    if split is None or split.state is not TaskState.COMPLETED:
        return []
    wrong = []
    for key, record in states.items():
        envelope = record.envelope if record is not None else None
        given = (envelope or {}).get("input", {}).get("upstream")
        # (A part cancelled while BLOCKED still holds the unresolved reference.)
        if isinstance(given, int) and given != split.attempt:
            wrong.append(f"{key} got attempt {given}'s result of split (won by {split.attempt})")
    return wrong


def _overlaps(
    rid: str,
    executions: Sequence[Any],
    frozen: Mapping[int, Sequence[tuple[float, float]]],
    report: ChaosReport,
) -> None:
    horizon = datetime.now(UTC).timestamp()
    ordered = sorted(executions, key=lambda e: e.start)
    for index, before in enumerate(ordered):
        for after in ordered[index + 1 :]:
            overlap = overlap_s(before, after, frozen, horizon)
            report.max_overlap_s = max(report.max_overlap_s, overlap)
            if overlap > report.skew_budget_s:
                report.overlaps_beyond_budget += 1
                report.violations.append(
                    f"{rid}: attempts {before.attempt} and {after.attempt} overlapped "
                    f"{overlap:.3f}s (skew budget {report.skew_budget_s:g}s)"
                )


def _repairs(events: EventStore) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for detail_type in ("Task Repaired", "Job Repaired"):
        for event in events.events_by_type(detail_type):
            counts[str((event.get("payload") or {}).get("repair", detail_type))] += 1
    return dict(counts)


def _dead_lettered(record: TaskRecord) -> bool:
    error = record.raw.get("error")
    return isinstance(error, Mapping) and error.get("reason") == "dlq"


def _states(states: Mapping[str, TaskRecord | None]) -> dict[str, str]:
    return {k: (r.state.value if r else "missing") for k, r in states.items()}


def results_document(
    report: ChaosReport, *, command: str, config: Mapping[str, Any]
) -> dict[str, Any]:
    """What bench/results gets: the table, the fault counts, the violations."""
    return {
        "command": command,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": dict(config),
        "summary": report.summary(),
        "faults_by_kind": report.faults,
        "repairs_by_kind": report.repairs,
        "violations": report.violations,
        "findings": report.findings,
    }
