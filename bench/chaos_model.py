"""What the chaos harness plans, does and reports (shared by bench.chaos and its verdicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentq.envelope import TaskEnvelope
from agentq.states import TaskState

Kind = Literal["ok", "flaky", "permanent", "timeout", "duplicate", "once", "cancel", "agent"]
EXPECTED: dict[Kind, TaskState] = {
    "ok": TaskState.COMPLETED,
    "flaky": TaskState.COMPLETED,
    "permanent": TaskState.FAILED,
    "timeout": TaskState.TIMEOUT,
    "duplicate": TaskState.COMPLETED,
    "once": TaskState.COMPLETED,  # one attempt; --faults aims its writes' faults at it
    # Cancelled at a chosen moment (bench.chaos_sched): its end depends on the answer,
    # which bench.chaos_sched_verify judges.
    "cancel": TaskState.CANCELLED,
    # A resumable agent task (bench.chaos_agents, which verifies it).
    "agent": TaskState.COMPLETED,
}
TERMINAL_EVENTS = {
    "Task Completed": TaskState.COMPLETED,
    "Task Failed": TaskState.FAILED,
    "Task Timeout": TaskState.TIMEOUT,
    "Task Cancelled": TaskState.CANCELLED,
}
MARKER = "AGENTQ_CHAOS_RUN"


@dataclass(frozen=True, kw_only=True)
class Planned:
    envelope: TaskEnvelope
    kind: Kind


@dataclass(frozen=True, kw_only=True)
class PlannedJob:
    """A job of the run: its spec, and the kind each of its tasks was given."""

    job_id: str
    tenant: str
    spec: Mapping[str, Any]
    kinds: Mapping[str, Kind]  # task key -> kind


@dataclass(frozen=True, kw_only=True)
class Malformed:
    body: str
    attributes: Mapping[str, str]
    request_id: str | None  # the id a `Task Failed` must carry, when there is one
    tenant: str


@dataclass(frozen=True, kw_only=True)
class Kill:
    at: float
    worker: str
    worker_id: str  # the incarnation that died (its WORKER_ID)
    pids: tuple[int, ...]  # the task children that died with it (or the one child)
    child_only: bool


@dataclass(frozen=True, kw_only=True)
class Freeze:
    """A worker and its children stopped (SIGSTOP) past their lease, then resumed."""

    at: float
    until: float
    worker: str
    worker_id: str
    pids: tuple[int, ...]  # the task children frozen with it
    # None: every task the worker held. A drain strikes only the tasks its log names
    # (given back, released, or still being locked when its time ran out).
    request_ids: frozenset[str] | None = None
    # (pid, when) for each frozen child seen gone after the thaw: a child whose lease
    # lapsed while it was stopped ends itself at once (its watchdog SIGKILLs its group,
    # too soon for the task to record its end), so this is its execution's only end.
    ended: tuple[tuple[int, float], ...] = ()


@dataclass
class ChaosReport:
    tasks: int = 0
    malformed: int = 0
    duplicates_sent: int = 0
    worker_kills: int = 0
    child_kills: int = 0
    executions: int = 0
    retries: int = 0
    duplicates_suppressed: int = 0
    held_elsewhere: int = 0
    dead_lettered: int = 0
    # Dead letters sent back to the task queue with attempts left (agentq/dlq/returns.py).
    dlq_returned: int = 0
    failed_by_chaos: int = 0
    seconds: float = 0.0
    killing_seconds: float = 0.0  # how long the killer struck
    # Strikes due while no worker was up to strike (a starved host restarts them slowly).
    idle_strikes: int = 0
    # Tasks sent past the plan to keep work running until the strike quotas were met.
    top_ups: int = 0
    events_lost: int = 0
    dead_lettered_unrun: int = 0
    # Attempts ended because their lease was about to lapse unrenewed (worker/child/leasefile.py).
    worker_fences: int = 0
    child_fences: int = 0
    # -- --faults mode ------------------------------------------------------------------
    faults_mode: bool = False
    jobs: int = 0
    job_tasks: int = 0
    stale_holders: int = 0
    skewed_workers: str = ""
    jobs_open: int = 0
    jobs_bad_close: int = 0
    tasks_lost: int = 0
    results_checked: int = 0
    results_mismatched: int = 0
    results_unchecked: int = 0  # completed tasks whose result names no attempt to compare
    dead_lettered_with_attempts: int = 0
    one_attempt_tasks: int = 0
    unreadable_copies: int = 0  # of finished tasks, sent to be rejected
    dispatched_unsent: int = 0  # job tasks the dispatcher moved to PENDING, never sent
    overlaps_beyond_budget: int = 0
    ran_past_lease: int = 0  # executions whose code ended after a freeze past their lease
    # Dead-letter close-outs the harness staged (bench.chaos_closeout): how many, how many
    # were retried after their publish failed, how many lack their one stored Task Failed.
    closeouts: int = 0
    closeouts_retried: int = 0
    closeouts_by_worker: int = 0
    closeouts_bad: int = 0
    # Drain strikes (bench.chaos_drains): messages they gave back or released, and those
    # never replaced by a fresh copy.
    drains: int = 0
    drain_givebacks: int = 0
    drain_givebacks_spent: int = 0
    max_overlap_s: float = 0.0
    skew_budget_s: float = 0.0
    repairs: dict[str, int] = field(default_factory=dict)
    # The scheduling mix's counts (bench.chaos_sched_verify.ScheduleVerdict, as a dict).
    schedule: dict[str, Any] = field(default_factory=dict)
    # The resumable agent tasks' counts (bench.chaos_agents.verify_agents, AgentVerdict).
    agents: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "tasks": self.tasks,
            "malformed": self.malformed,
            "duplicates sent": self.duplicates_sent,
            "worker kills": self.worker_kills,
            "child kills": self.child_kills,
            "executions": self.executions,
            "retries": self.retries,
            "duplicates suppressed": self.duplicates_suppressed,
            "held elsewhere (backed off)": self.held_elsewhere,
            "dead-lettered": self.dead_lettered,
            "dead letters returned": self.dlq_returned,
            "failed by chaos": self.failed_by_chaos,
            "dead-lettered without running": self.dead_lettered_unrun,
            "terminal events lost": self.events_lost,
            "lease fences (worker / child watchdog)": f"{self.worker_fences} / {self.child_fences}",
            "seconds": round(self.seconds, 1),
            "killing seconds": round(self.killing_seconds, 1),
            "strikes with no worker up": self.idle_strikes,
            "tasks added for the strike quotas": self.top_ups,
        }
        if self.faults_mode:
            summary.update(self.faults_summary())
        summary["violations"] = len(self.violations)
        return summary

    def faults_summary(self) -> dict[str, Any]:
        return {
            "jobs (tasks)": f"{self.jobs} ({self.job_tasks})",
            "stale holders (frozen past the lease)": self.stale_holders,
            "skewed workers (ms)": self.skewed_workers or "-",
            "INV tasks not terminal (lost)": self.tasks_lost,
            "INV jobs left open": self.jobs_open,
            "INV jobs closed wrongly (state or close events)": self.jobs_bad_close,
            "INV results not the named attempt's": (
                f"{self.results_mismatched} of {self.results_checked} "
                f"({self.results_unchecked} unchecked)"
            ),
            "INV dead-lettered with attempts left": self.dead_lettered_with_attempts,
            "INV job tasks dispatched without a message": self.dispatched_unsent,
            "INV DLQ close-outs without exactly one stored Task Failed": (
                f"{self.closeouts_bad} of {self.closeouts} "
                f"({self.closeouts_retried} retried after a failed publish, "
                f"{self.closeouts_by_worker} failed by a worker after a re-send)"
            ),
            "INV drain give-backs not requeued fresh": (
                f"{self.drain_givebacks_spent} of {self.drain_givebacks} ({self.drains} drains)"
            ),
            "one-attempt tasks / unreadable copies of finished tasks": (
                f"{self.one_attempt_tasks} / {self.unreadable_copies}"
            ),
            "INV overlaps beyond the skew budget": (
                f"{self.overlaps_beyond_budget} (max {self.max_overlap_s:.2f}s, "
                f"budget {self.skew_budget_s:g}s)"
            ),
            "INV attempts whose code ran past their lease (frozen, then thawed)": (
                self.ran_past_lease
            ),
            **self._schedule_summary(),
            **(AgentVerdict(**self.agents).summary() if self.agents else {}),
            "reconciler repairs": _tally(self.repairs),
            "faults injected": sum(self.faults.values()),
        }

    def _schedule_summary(self) -> dict[str, Any]:
        if not self.schedule:
            return {}
        return ScheduleVerdict(**self.schedule).summary()


@dataclass
class ScheduleVerdict:
    """The scheduling mix's counts (bench.chaos_sched_verify fills them)."""

    tasks: int = 0
    cancels: dict[str, int] = field(default_factory=dict)  # outcome -> count
    ran_after_cancel: int = 0
    cancel_not_kept: int = 0
    delayed: int = 0
    started_early: int = 0
    most_early_s: float = 0.0
    over_limit: int = 0
    most_running: dict[str, int] = field(default_factory=dict)
    seats_left: int = 0
    lost_planted: int = 0
    lost_repaired: int = 0
    waiting_resent: int = 0
    parked_tasks: int = 0  # tasks a worker's log shows parked at least once
    # Re-sent after waiting unreceived in its queue past the bound (not promised).
    queued_resent: int = 0
    limits: dict[str, int] = field(default_factory=dict)  # tenant -> its limit

    def _most_running(self) -> str:
        return ", ".join(
            f"{tenant} {most}/{self.limits.get(tenant, '?')}"
            for tenant, most in sorted(self.most_running.items())
        )

    def summary(self) -> dict[str, Any]:
        cancels = ", ".join(f"{k} {v}" for k, v in sorted(self.cancels.items())) or "0"
        return {
            "scheduling mix tasks (cancels by answer)": f"{self.tasks} ({cancels})",
            "INV attempts run after a cancel answer / answers not kept": (
                f"{self.ran_after_cancel} / {self.cancel_not_kept}"
            ),
            "INV delayed tasks started early (of delayed; most early s)": (
                f"{self.started_early} of {self.delayed} ({self.most_early_s:+.2f})"
            ),
            "INV tenant limit exceeded (most running per tenant) / seats left": (
                f"{self.over_limit} ({self._most_running()}) / {self.seats_left}"
            ),
            "INV lost tasks not repaired (of planted) / parked tasks re-sent (of parked)": (
                f"{self.lost_planted - self.lost_repaired} of {self.lost_planted} / "
                f"{self.waiting_resent} of {self.parked_tasks}"
            ),
            "tasks re-sent after waiting in their queue past the bound": str(self.queued_resent),
        }


@dataclass
class AgentVerdict:
    """The resumable agent tasks' counts (bench.chaos_agents fills them)."""

    tasks: int = 0
    struck: int = 0  # killed by the harness at their scripted turn, checkpoint in S3
    completed: int = 0
    failed_by_chaos: int = 0
    resumed: int = 0  # winners whose resume record names an earlier checkpoint
    resumed_fresh: int = 0  # winners that followed a checkpoint, started afresh, said why
    no_final_checkpoint: int = 0  # COMPLETED, the last upload failed: no pointer
    not_terminal: int = 0
    winners_not_one: int = 0
    results_not_winners: int = 0
    checkpoints_not_winners: int = 0
    resumes_unexplained: int = 0
    cross_tenant: int = 0
    cross_tenant_reads: int = 0  # reads of a task as the other tenant, each "not found"

    def summary(self) -> dict[str, Any]:
        return {
            "agent tasks (struck at a turn / completed / failed by chaos)": (
                f"{self.tasks} ({self.struck} / {self.completed} / {self.failed_by_chaos})"
            ),
            "agent winners resumed / started afresh saying why / no final checkpoint": (
                f"{self.resumed} / {self.resumed_fresh} / {self.no_final_checkpoint}"
            ),
            "INV agent tasks not terminal / not one winner": (
                f"{self.not_terminal} / {self.winners_not_one}"
            ),
            "INV agent results / checkpoints not the winner's": (
                f"{self.results_not_winners} / {self.checkpoints_not_winners}"
            ),
            "INV agent resumes unexplained": self.resumes_unexplained,
            "INV agent transcripts across tenants (of reads tried)": (
                f"{self.cross_tenant} ({self.cross_tenant_reads})"
            ),
        }


def _tally(counts: Mapping[str, int]) -> str:
    if not counts:
        return "0"
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"
