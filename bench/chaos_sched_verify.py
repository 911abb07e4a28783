"""The scheduling promises, judged after a --faults chaos run (bench.chaos_sched):

- cancel: after a "cancelled" or "requested" answer no newer attempt is locked or runs;
  "cancelled" ends CANCELLED, "requested" CANCELLED or by the attempt it had;
- delay: no execution of a delayed task starts before its not-before (less the skew);
- tenant limits: from the executions' own times (frozen time excluded), never more than
  the limit running for longer than LIMIT_SLACK_S, no seat held once the run is over;
- reconciler: every task stored without a message re-sent and run; no waiting task
  re-sent while a live, unfrozen worker held it parked (from the workers' logs); a
  re-send of a message that sat in its queue past the bound is a finding, counted.
docs/benchmarks/chaos.md has the method and the runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final

from agentq.events import now_ms
from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from agentq.store.events import EventStore
from agentq.store.tasks import TaskRecord, TaskStore
from agentq.store.tenants import TenantLimitStore
from bench.chaos_executions import Execution, executions_of, fenced_children, frozen_windows
from bench.chaos_model import ChaosReport, Freeze, Kill, ScheduleVerdict
from bench.chaos_sched import LIMITS, CancelAnswer, ScheduleMix, SchedulePlan
from bench.stack import Stage
from worker.receive.consumer import SETTLED_LINE
from worker.receive.send_back import LOG_LINE
from worker.settle.prepare import PARKED_LINE, SEATED_LINE
from worker.settle.refusals import BACKING_OFF_LINE

# How long a limited tenant may run one task more than its limit: a seat is freed by
# the write that ends its task, so only a lapsed one is taken early, by a taker whose
# clock runs ahead, while its holder's child is fenced 1.5 s before its lease ends:
# 0.5 s with the run's 6 s leases and 2 s offsets, and a margin for a loaded host.
LIMIT_SLACK_S: Final = 1.0
# What a worker logs as it parks a message, and as the park ends: a seat taken, the
# message sent back (its park time over, no room, a drain), or any end of a message of
# the task there (another copy's end cuts the stretch short: a park missed, never one
# made up).
PARKED: Final = PARKED_LINE
UNPARKED: Final = (SEATED_LINE, BACKING_OFF_LINE, SETTLED_LINE, LOG_LINE["draining"],
                   LOG_LINE["passed_on"])  # fmt: skip
# A mark an injected fault refused: the reconciler may then re-send the task (promised
# only as "at worst the lock runs the reconciler's copy once", agentq.store.waiting).
MARK_FAILED: Final = "could not mark a waiting task"


@dataclass(frozen=True)
class Park:
    """A stretch a worker held a task's message parked (epoch seconds)."""

    worker: str
    since: float
    until: float
    mark_failed: bool = False


def verify_schedule(
    stage: Stage,
    mix: ScheduleMix,
    side_log: Sequence[Mapping[str, Any]],
    kills: Sequence[Kill],
    freezes: Sequence[Freeze],
    fleet: Sequence[WorkerProcess],
    report: ChaosReport,
    *,
    budget_s: float,
) -> None:
    """Judge the mix into `report` (its violations, and `schedule`: the counts)."""
    runs = executions_of(side_log, kills, fenced_children(fleet), freezes)
    horizon = time.time()
    parks = parked_stretches({w.name: w.log_records() for w in fleet}, kills, horizon)
    verdict = judge(stage, mix.plan, mix.answers, runs, frozen_windows(freezes),
                    report.violations, budget_s=budget_s, horizon=horizon, parks=parks,
                    freezes=freezes, findings=report.findings)  # fmt: skip
    report.violations.extend(mix.errors)
    report.schedule = asdict(verdict)


def judge(
    stage: Stage,
    plan: SchedulePlan,
    answers: Sequence[CancelAnswer],
    runs: Mapping[str, Sequence[Execution]],
    frozen: Mapping[int, Sequence[tuple[float, float]]],
    violations: list[str],
    *,
    budget_s: float,
    horizon: float,
    parks: Mapping[str, Sequence[Park]],
    freezes: Sequence[Freeze],
    findings: list[str],
) -> ScheduleVerdict:
    ddb, table = stage.clients["dynamodb"], stage.resources.table_name
    tasks = TaskStore(ddb, table)
    events = EventStore(ddb, table, app_name=stage.resources.names.app_name)
    verdict = ScheduleVerdict(tasks=len(plan.planned), limits=dict(LIMITS), parked_tasks=len(parks))
    for answer in answers:
        verdict.cancels[answer.outcome] = verdict.cancels.get(answer.outcome, 0) + 1
        record = tasks.get(plan.tenant_of[answer.request_id], answer.request_id)
        seen = len(violations)
        _check_cancel(answer, record.state if record else None,
                      record.attempt if record else None,
                      runs.get(answer.request_id, ()), verdict, violations)  # fmt: skip
        if len(violations) > seen:  # what happened, for whoever reads the violation
            violations[-1] += _what_happened(events, plan.tenant_of[answer.request_id],
                                             answer, runs.get(answer.request_id, ()))  # fmt: skip
    for rid, not_before in plan.not_before_ms.items():
        verdict.delayed += 1
        for execution in runs.get(rid, ()):
            early = not_before / 1000 - execution.start
            verdict.most_early_s = max(verdict.most_early_s, early)
            if early > budget_s:
                verdict.started_early += 1
                violations.append(f"{rid}: attempt {execution.attempt} started {early:.2f}s "
                                  f"before its not-before (skew budget {budget_s:g}s)")  # fmt: skip
    seats = TenantLimitStore(ddb, table)
    at_end = now_ms()
    for tenant, limit in LIMITS.items():
        mine = [e for rid, es in runs.items() if plan.tenant_of.get(rid) == tenant for e in es]
        most, stretches = running_over(mine, limit, frozen, horizon, min(budget_s, LIMIT_SLACK_S))
        verdict.most_running[tenant] = most
        for since, until, count in stretches:
            verdict.over_limit += 1
            violations.append(f"{tenant} (limit {limit}): {count} running at once for "
                              f"{until - since:.2f}s from {since:.3f}")  # fmt: skip
        for seat in seats.seats(tenant):
            if seat.live(at_end):
                verdict.seats_left += 1
                violations.append(f"{tenant}: seat {seat.index} still held by "
                                  f"{seat.request_id} after the run")  # fmt: skip
    _check_repairs(plan, tasks, events, parks, freezes, verdict, violations, findings)
    return verdict


def parked_stretches(
    logs: Mapping[str, Sequence[Mapping[str, Any]]], kills: Sequence[Kill], horizon: float
) -> dict[str, list[Park]]:
    """Each task's parked stretches, from each worker's log (its incarnations one after
    another): from its "parked" line to the line that ends the park, or to the kill of
    the incarnation that held it."""
    stretches: dict[str, list[Park]] = {}
    for worker, records in logs.items():
        deaths = sorted(k.at for k in kills if k.worker == worker and not k.child_only)
        for rid, park in _parks_of(worker, records, deaths, horizon):
            stretches.setdefault(rid, []).append(park)
    return stretches


def _parks_of(
    worker: str, records: Sequence[Mapping[str, Any]], deaths: Sequence[float], horizon: float
) -> list[tuple[str, Park]]:
    parks: list[tuple[str, Park]] = []
    open_since: dict[str, float] = {}
    failed: set[str] = set()  # a mark refused during the open park

    def close(rid: str, until: float) -> None:
        parks.append((rid, Park(worker, open_since.pop(rid), until, rid in failed)))
        failed.discard(rid)

    for record in records:
        message, rid = record.get("message"), record.get("requestId")
        if not isinstance(rid, str):
            continue
        if message == MARK_FAILED:
            failed.add(rid)
            continue
        if message != PARKED and message not in UNPARKED:
            continue
        at = _log_time(record)
        for rid_open, since in list(open_since.items()):
            death = next((d for d in deaths if since <= d <= at), None)
            if death is not None:
                close(rid_open, death)
        if message == PARKED:
            if rid not in open_since:
                failed.discard(rid)  # one refused as it went back before: not this park
            open_since.setdefault(rid, at)
        elif rid in open_since:
            close(rid, at)
    for rid_open, since in list(open_since.items()):
        close(rid_open, next((d for d in deaths if d >= since), horizon))
    return parks


def parked_at(parks: Sequence[Park], freezes: Sequence[Freeze], at: float) -> str | None:
    """The worker that held the message parked at `at`, thawed all the while it had to
    keep the task marked (the reconciler's bound before `at`); else None."""
    for park in parks:
        if park.mark_failed or not park.since <= at <= park.until:
            continue
        if any(f.worker == park.worker and f.at <= at and f.until >= park.since
               for f in freezes):  # fmt: skip
            continue  # a frozen worker writes no mark: its message looks lost
        return park.worker
    return None


def _log_time(record: Mapping[str, Any]) -> float:
    # Powertools' format: "2026-12-01 22:51:54,018+0000" (the worker's wall clock, which
    # the chaos clock offsets do not move).
    return datetime.strptime(str(record["timestamp"]), "%Y-%m-%d %H:%M:%S,%f%z").timestamp()


def _check_repairs(
    plan: SchedulePlan,
    tasks: TaskStore,
    events: EventStore,
    parks: Mapping[str, Sequence[Park]],
    freezes: Sequence[Freeze],
    verdict: ScheduleVerdict,
    violations: list[str],
    findings: list[str],
) -> None:
    """Every lost task re-sent and run; no waiting task re-sent while parked."""
    lost = {p.envelope.request_id for p in plan.lost}
    verdict.lost_planted = len(lost)
    for item in plan.planned:
        rid, tenant = item.envelope.request_id, item.envelope.tenant
        timeline = events.timeline(tenant, rid)
        repairs = [e for e in timeline if e.get("detailType") == "Task Repaired"]
        if rid in lost:
            problem = lost_task_problem(timeline, tasks.get(tenant, rid))
            if problem is None:
                verdict.lost_repaired += 1
            else:
                violations.append(f"{rid}: stored without a message, {problem}")
            continue
        for repair in repairs:
            payload = repair.get("payload") or {}
            if payload.get("repair") not in ("pending_lost", "retrying_lost"):
                continue  # a lapsed lease's re-send is the core chaos's to judge
            at = datetime.fromisoformat(str(repair.get("timestamp"))).timestamp()
            holder = parked_at(parks.get(rid, ()), freezes, at)
            line = f"{rid} ({tenant}): re-sent by the reconciler ({payload.get('detail')})"
            if holder is None:
                verdict.queued_resent += 1
                findings.append(f"{line}: its message was in no worker's hands")
            else:
                verdict.waiting_resent += 1
                violations.append(f"{line} while {holder} held it parked")


def lost_task_problem(
    timeline: Sequence[Mapping[str, Any]], record: TaskRecord | None
) -> str | None:
    """None when a task stored without a message was re-sent and a worker then locked
    it and it ended; what went wrong else. Having no message, it can have been locked
    only after a re-send (event times come from skewed clocks, so not their order).

    How it ended is the core verdict's to judge (chaos_verify: a task whose holders the
    strikes hit may fairly end FAILED); this promise is the reconciler's re-send."""
    if not any(e.get("detailType") == "Task Repaired" for e in timeline):
        return f"never re-sent, {record and record.state.value}"
    # Locked: its `Task Processing Started`, or the attempt its STATE item counts (a
    # worker's lock counts it; the event may be lost with a killed worker's batch).
    taken = any(e.get("detailType") == "Task Processing Started" for e in timeline) or (
        record is not None and record.attempt >= 1
    )
    if record is None or not record.state.terminal or not taken:
        error = record.raw.get("error") if record is not None else None
        return (f"re-sent, {'locked' if taken else 'never locked'} after, "
                f"{record and record.state.value} at attempt {record and record.attempt} "
                f"(error: {error})")  # fmt: skip
    return None


def _what_happened(
    events: EventStore, tenant: str, answer: CancelAnswer, executions: Sequence[Execution]
) -> str:
    timeline = [(e.get("detailType"), e.get("attempt"), e.get("workerId"), e.get("timestamp"))
                for e in events.timeline(tenant, answer.request_id)]  # fmt: skip
    ran = [(e.attempt, e.pid, round(e.start, 3), e.end and round(e.end, 3)) for e in executions]
    return f" | answered at {answer.answered_at:.3f}; events: {timeline}; executions: {ran}"


def _check_cancel(
    answer: CancelAnswer,
    state: TaskState | None,
    attempt: int | None,
    executions: Sequence[Execution],
    verdict: ScheduleVerdict,
    violations: list[str],
) -> None:
    rid = answer.request_id
    if answer.outcome in ("finished", "error"):
        return  # ended before the cancel (its expected end is its own), or unanswered
    later = [e for e in executions if e.attempt > answer.attempt]
    if later or (attempt or 0) > answer.attempt:
        # A newer attempt locked (counted) is one started, even if its code never ran.
        verdict.ran_after_cancel += 1
        violations.append(f"{rid}: answered {answer.outcome!r} ({answer.moment}) at attempt "
                          f"{answer.attempt}, then attempt {attempt} was locked, "
                          f"{[e.attempt for e in later]} ran")  # fmt: skip
    kept = state is TaskState.CANCELLED or (
        answer.outcome == "requested" and state is not None and state.terminal
        and attempt == answer.attempt
    )  # fmt: skip
    if not kept:
        verdict.cancel_not_kept += 1
        violations.append(f"{rid}: answered {answer.outcome!r} ({answer.moment}), ended "
                          f"{state and state.value} at attempt {attempt}")  # fmt: skip


def running_over(
    executions: Sequence[Execution],
    limit: int,
    frozen: Mapping[int, Sequence[tuple[float, float]]],
    horizon: float,
    budget_s: float,
) -> tuple[int, list[tuple[float, float, int]]]:
    """The most executions running at once (frozen time excluded), and each stretch
    longer than `budget_s` with more than `limit` running: (from, to, most running)."""
    edges: list[tuple[float, int]] = []
    for execution in executions:
        end = execution.end if execution.end is not None else horizon
        for since, until in _running_pieces(execution.start, end, frozen.get(execution.pid, ())):
            edges += [(since, 1), (until, -1)]
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # ends before starts at one instant
    running = most = 0
    over_since: float | None = None
    over_most = 0
    stretches: list[tuple[float, float, int]] = []
    for at, step in edges:
        running += step
        most = max(most, running)
        if running > limit:
            if over_since is None:
                over_since, over_most = at, running
            over_most = max(over_most, running)
        elif over_since is not None:
            if at - over_since > budget_s:
                stretches.append((over_since, at, over_most))
            over_since = None
    return most, stretches


def _running_pieces(
    start: float, end: float, stops: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    pieces, at = [], start
    for since, until in sorted(stops):
        if until <= at or since >= end:
            continue
        if since > at:
            pieces.append((at, since))
        at = max(at, until)
    if at < end:
        pieces.append((at, end))
    return pieces
