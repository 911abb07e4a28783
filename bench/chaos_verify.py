"""The chaos harness's verdict: what the run must prove, checked from the STATE items,
event timelines, queues, DLQ archive and the tasks' own side log (see bench.chaos).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psutil

from agentq.dlq import DlqArchive
from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from agentq.store.events import EventStore
from agentq.store.tasks import TaskRecord, TaskStore
from bench.chaos_executions import (
    Execution,
    executions_of,
    fenced_children,
    frozen_windows,
    overlap_s,
    ran_past_lease,
)
from bench.chaos_model import (
    EXPECTED,
    MARKER,
    TERMINAL_EVENTS,
    ChaosReport,
    Freeze,
    Kill,
    Malformed,
    Planned,
)
from bench.stack import Stage
from worker.child.leasefile import FENCE_MESSAGE, WATCHDOG_LINE


# -- verifying ---------------------------------------------------------------------------
def verify(
    stage: Stage,
    planned: Sequence[Planned],
    bad: Sequence[Malformed],
    side_log: Sequence[Mapping[str, Any]],
    kills: Sequence[Kill],
    fleet: Sequence[WorkerProcess],
    run_id: str,
    report: ChaosReport,
    *,
    freezes: Sequence[Freeze] = (),
    budget_s: float = 0.0,
    lease_s: float = 0.0,
) -> None:
    """`budget_s`: how far two attempts' executions may overlap (the clock-skew budget);
    time a worker spent frozen (`freezes`) is not execution. `lease_s`: how long a lock
    holds unrenewed (a one-attempt task's holder must be struck within it)."""
    ddb = stage.clients["dynamodb"]
    table = stage.resources.table_name
    store = TaskStore(ddb, table)
    events = EventStore(ddb, table, app_name=stage.resources.names.app_name)
    runs = executions_of(side_log, kills, fenced_children(fleet), freezes)
    violations = report.violations
    report.worker_kills = sum(1 for k in kills if not k.child_only)
    report.child_kills = sum(1 for k in kills if k.child_only)
    report.executions = sum(len(r) for r in runs.values())
    report.retries = report.executions - len(runs)
    killed_holders = {k.worker_id for k in kills}
    frozen = frozen_windows(freezes)

    for item in planned:
        rid = item.envelope.request_id
        record = store.get(item.envelope.tenant, rid)
        executions = runs.get(rid, [])
        _check_leases(rid, executions, freezes, lease_s, report)
        if record is None or not record.state.terminal:
            timeline = events.timeline(item.envelope.tenant, rid)
            seen = [(e.get("detailType"), e.get("workerId")) for e in timeline]
            archived = [m.outcome for m in DlqArchive(stage.clients["s3"],
                        stage.resources.bucket).list(request_id=rid)]  # fmt: skip
            violations.append(
                f"{rid} ({item.kind}): not terminal: {record and record.state.value}, "
                f"owner {record and record.owner}, executions {len(executions)}, "
                f"dead letters {archived}, timeline {seen}"
            )
            continue
        timeline = events.timeline(item.envelope.tenant, rid)
        _check_terminal_events(timeline, item, record, report)
        # A kill that hit the task's holder (before or after its child started) used up an
        # attempt and receives; SQS may then dead-letter it. FAILED is a fair end then.
        holders = {e.get("workerId") for e in timeline
                   if e.get("detailType") == "Task Processing Started"}  # fmt: skip
        # An attempt ended from outside its task also counts: a kill, or a SIGTERM
        # ("terminated") from a lease fence (a timeout task is ended so by design).
        ended_outside = (
            ("killed", None) if item.kind == "timeout" else ("killed", None, "terminated")
        )
        disrupted = bool(holders & killed_holders) or any(
            e.outcome in ended_outside for e in executions
        )
        unrun = not executions and not holders
        # A cancelled task's end depends on its answer (bench.chaos_sched_verify).
        if record.state is not EXPECTED[item.kind] and item.kind != "cancel":
            if record.state is TaskState.FAILED and disrupted:
                report.failed_by_chaos += 1
            elif record.state is TaskState.FAILED and unrun and _dead_lettered(record):
                # Its receives were used up (by workers killed before they locked it, or
                # by back-offs) before it ever ran: SQS moved it to the DLQ and the DLQ
                # processor failed it once. Exactly-once holds; the outcome is a finding.
                report.failed_by_chaos += 1
                report.dead_lettered_unrun += 1
                report.findings.append(f"{rid} ({item.kind}): dead-lettered without running")
            elif (
                record.state is TaskState.FAILED
                and _attempts_unrun(record, executions)
                # A one-attempt task's attempt may be spent unrun only by a holder a
                # strike hit; a live holder that spent it lost its own lock to a fault.
                and (item.kind != "once" or _struck_while_held(record, kills, freezes, lease_s))
            ):
                # Attempts are counted at the lock; a holder killed before its child
                # started (its `Task Processing Started` still in its batcher) leaves
                # an attempt used and nothing run. Exactly-once holds; a finding.
                report.failed_by_chaos += 1
                report.findings.append(
                    f"{rid} ({item.kind}): attempts used up ({record.attempt}) by holders "
                    f"that never ran it ({len(executions)} execution(s))"
                )
            elif record.state is TaskState.FAILED and _dead_lettered(record):
                # SQS counts every receive (duplicates, back-offs behind a live holder)
                # toward maxReceiveCount, so a retrying task can reach the DLQ with
                # attempts left. One terminal state still holds; the lost retry is a
                # finding about receive budgets, not a broken exactly-once promise.
                report.failed_by_chaos += 1
                report.findings.append(
                    f"{rid} ({item.kind}): dead-lettered by its receive count after "
                    f"{len(executions)} execution(s), attempts left"
                )
            else:
                violations.append(
                    f"{rid} ({item.kind}): {record.state.value}, expected "
                    f"{EXPECTED[item.kind].value} (error: {record.raw.get('error')}; "
                    f"executions {len(executions)}; holders {sorted(map(str, holders))})"
                )
        _check_executions(item, record, executions, report, frozen, budget_s)

    rejected = _rejections(fleet)
    for message in bad:
        if message.request_id is None:
            continue
        timeline = events.timeline(message.tenant, message.request_id)
        if any(e.get("detailType") == "Task Failed" for e in timeline):
            continue
        rejection = rejected.get(message.request_id)
        if rejection is not None and _killed_soon_after(rejection, kills):
            # Its worker died between the delete and the event's flush (two batchers):
            # an event lost to the kill, like a terminal event (counted with those).
            report.events_lost += 1
            report.findings.append(
                f"malformed message {message.request_id}: Task Failed lost, its worker "
                f"{rejection[0]} was killed within 2 s of rejecting it"
            )
            continue
        violations.append(f"malformed message {message.request_id}: no Task Failed")

    archive = DlqArchive(stage.clients["s3"], stage.resources.bucket)
    dead = archive.list()
    report.dead_lettered = len({m.request_id for m in dead if m.outcome != "returned"})
    report.dlq_returned = sum(1 for m in dead if m.outcome == "returned")
    for letter in dead:
        if letter.outcome == "failed" and letter.request_id:
            timeline = events.timeline(letter.tenant or "", letter.request_id)
            if not any(e.get("detailType") == "Task Failed" for e in timeline):
                violations.append(f"dead-lettered {letter.request_id}: no Task Failed")

    queues = {f"{tier} tier queue": url for tier, url in stage.resources.tier_queues.items()}
    for name, url in {"task queue": stage.queue_url, **queues,
                      "DLQ": stage.resources.dlq_url}.items():  # fmt: skip
        visible, in_flight = stage.queue_counts(url)
        if visible or in_flight:
            violations.append(f"{name}: {visible} visible, {in_flight} in flight at the end")

    for proc in survivors(run_id):
        violations.append(f"orphan process {proc.pid}: {' '.join(proc.cmdline())[:120]}")
    # A worker forked by a launcher (agentq.local.launcher) carries the launcher's
    # environment, not the marker: its own handle says whether it outlived the run.
    for worker in fleet:
        if worker.alive():
            violations.append(f"orphan process {worker.pid}: worker {worker.name}")

    for worker in fleet:
        for record_ in worker.log_records():
            if record_.get("message") == "message settled":
                verdict = record_.get("verdict")
                if verdict == "duplicate":
                    report.duplicates_suppressed += 1
                elif verdict == "held_elsewhere":
                    report.held_elsewhere += 1
            elif record_.get("message") == FENCE_MESSAGE:
                report.worker_fences += 1
            elif str(record_.get("message", "")).endswith(WATCHDOG_LINE):
                report.child_fences += 1


def _struck_while_held(
    record: TaskRecord, kills: Sequence[Kill], freezes: Sequence[Freeze], lease_s: float
) -> bool:
    """Whether a strike hit the incarnation that took the task's last lock while that
    lock held (from its `startedAt` for a lease, give or take the clocks' skew): only
    then may its attempt be spent without running. A holder whose own lock came back
    as someone else's (its write applied and retried) was struck by nothing."""
    owner, started = record.raw.get("owner"), record.raw.get("startedAt")
    if not isinstance(started, int):
        return True  # no lock time to judge by
    since, until = started / 1000 - _SKEW_S, started / 1000 + lease_s + _SKEW_S
    hits = [k.at for k in kills if k.worker_id == owner]
    hits += [f.at for f in freezes if f.worker_id == owner
             and (f.request_ids is None or record.request_id in f.request_ids)]  # fmt: skip
    return any(since <= at <= until for at in hits)


_SKEW_S = 2.5  # the run's clock offsets (±2 s) and a margin


def _attempts_unrun(record: TaskRecord, executions: Sequence[Execution]) -> bool:
    error = record.raw.get("error")
    return (
        isinstance(error, Mapping)
        and error.get("exception_type") == "AttemptsExhausted"
        and len(executions) < record.attempt
    )


def _rejections(fleet: Sequence[WorkerProcess]) -> dict[str, tuple[str, float]]:
    """Request id -> (worker name, when) of each `message rejected` log line."""
    found: dict[str, tuple[str, float]] = {}
    for worker in fleet:
        for record in worker.log_records():
            if record.get("message") == "message rejected" and record.get("requestId"):
                with contextlib.suppress(KeyError, ValueError):
                    when = datetime.strptime(record["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z")
                    found[str(record["requestId"])] = (worker.name, when.timestamp())
    return found


def _killed_soon_after(
    seen: tuple[str, float], kills: Sequence[Kill], within_s: float = 2.0
) -> bool:
    name, at = seen
    return any(k.worker == name and not k.child_only and 0 <= k.at - at <= within_s for k in kills)


def _dead_lettered(record: TaskRecord) -> bool:
    error = record.raw.get("error")
    return isinstance(error, Mapping) and error.get("reason") == "dlq"


def _check_terminal_events(
    timeline: Sequence[Mapping[str, Any]], item: Planned, record: TaskRecord, report: ChaosReport
) -> None:
    violations = report.violations
    terminal = [e["detailType"] for e in timeline if e.get("detailType") in TERMINAL_EVENTS]
    rid = item.envelope.request_id
    if not terminal:
        # Known gap, not an exactly-once breach: the worker died between finalizing the
        # STATE item and publishing the event (see docs/benchmarks/chaos.md). Counted apart.
        seen = [(e.get("detailType"), e.get("workerId"), e.get("attempt")) for e in timeline]
        report.events_lost += 1
        report.findings.append(
            f"{rid} ({item.kind}): {record.state.value} by {record.raw.get('owner')} but no "
            f"terminal event; timeline {seen}"
        )
    elif len(terminal) > 1:
        seen = [(e.get("detailType"), e.get("workerId"), e.get("attempt")) for e in timeline]
        violations.append(
            f"{rid} ({item.kind}): state {record.state.value} (attempt {record.attempt}, "
            f"by {record.raw.get('owner') or record.raw.get('finishedBy')}) but "
            f"{len(terminal)} terminal events; timeline {seen}"
        )
    elif TERMINAL_EVENTS[terminal[0]] is not record.state:
        violations.append(f"{rid}: event {terminal[0]} disagrees with state {record.state.value}")


def _check_leases(
    rid: str,
    executions: Sequence[Execution],
    freezes: Sequence[Freeze],
    lease_s: float,
    report: ChaosReport,
) -> None:
    """No attempt's code ran on past a lease it had lost: one frozen past its lease never
    runs on when thawed while a newer attempt holds the task. Its worker may have renewed
    the lapsed lease first (the renewal is conditional on its token, so no one else held
    it): then running on is its right, counted among the findings."""
    for execution, freeze in ran_past_lease(executions, freezes, lease_s):
        end = execution.end if execution.end is not None else float("inf")
        taken_over = any(o.attempt > execution.attempt and o.start < end for o in executions)
        what = (
            f"{rid}: attempt {execution.attempt} (pid {execution.pid}) ran on past its lease: "
            f"frozen {freeze.until - freeze.at:.1f}s (lease {lease_s:g}s), its code ended "
            f"{execution.end:.3f} ({execution.outcome}) after the thaw"
        )
        if taken_over:
            report.ran_past_lease += 1
            report.violations.append(what + ", while a newer attempt held the task")
        else:
            report.findings.append(what + ", its lease renewed after the thaw")


def _check_executions(
    item: Planned,
    record: TaskRecord,
    executions: list[Execution],
    report: ChaosReport,
    frozen: Mapping[int, Sequence[tuple[float, float]]],
    budget_s: float,
) -> None:
    rid = item.envelope.request_id
    violations = report.violations
    horizon = time.time()
    for before, after in itertools.combinations(executions, 2):
        overlap = overlap_s(before, after, frozen, horizon)
        report.max_overlap_s = max(report.max_overlap_s, overlap)
        if overlap > budget_s:
            report.overlaps_beyond_budget += 1
            violations.append(
                f"{rid}: attempt {after.attempt} (pid {after.pid}) started {overlap:.3f}s "
                f"before attempt {before.attempt} (pid {before.pid}) ended"
                + (f" (skew budget {budget_s:g}s)" if budget_s else "")
            )
    if record.state is TaskState.COMPLETED:
        finisher = [e for e in executions if e.attempt == record.attempt and e.outcome == "ok"]
        if not finisher:
            violations.append(f"{rid}: COMPLETED by attempt {record.attempt}, no such execution")
            return
        done = finisher[-1].end or horizon
        again = [e for e in executions if e.start > done]
        if again:
            violations.append(f"{rid}: ran again after completing ({len(again)} more)")


def survivors(run_id: str) -> list[psutil.Process]:
    """Processes of this run still alive: they carry the run's marker in their env."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            if proc.pid == me or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found
