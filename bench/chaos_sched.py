"""The scheduling mix of a --faults chaos run: tiers, tenant limits, delays, cancels and
lost messages, submitted as a producer would while workers die around them.

Every task on a priority tier's queue; two limited tenants (2 and 1 running at once)
that wait for seats longer than the reconciler's bound; delayed tasks with an undelayed
copy; cancels at chosen moments (queued, delayed, running, retrying, racing their end),
each answer recorded with the task's attempt; tasks stored PENDING with no message for
the reconciler. docs/benchmarks/chaos.md has the mix's sizes; bench.chaos_sched_verify
judges what came of it.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.errors import NotCancellable
from agentq.events import now_ms
from agentq.resources import PRIORITY_TIERS
from agentq.states import TaskState
from agentq.store.tenants import TenantLimitStore
from bench.chaos_model import Kind, Planned
from bench.stack import Stage

LIMITS: Final = {"chaos-lim-a": 2, "chaos-lim-b": 1}
OPEN_TENANT: Final = "chaos-open"
Moment = Literal["queued", "delayed", "running", "retrying", "racing"]
MOMENTS: Final[tuple[Moment, ...]] = ("queued", "delayed", "running", "retrying", "racing")
# How long a cancel waits for its moment (a task that never reached it is cancelled then).
MOMENT_WAIT_S: Final = 90.0


@dataclass(frozen=True, kw_only=True)
class PlannedCancel:
    request_id: str
    tenant: str
    moment: Moment
    seconds: float  # the task's run time (a racing cancel aims at its end)


@dataclass(frozen=True, kw_only=True)
class CancelAnswer:
    """What the caller was told, when, and the attempt the task then had."""

    request_id: str
    moment: Moment
    answered_at: float
    outcome: str  # "cancelled" | "requested" | "finished" (NotCancellable) | "error"
    state: str
    attempt: int


@dataclass
class SchedulePlan:
    planned: list[Planned] = field(default_factory=list)
    delay_ms: dict[str, int] = field(default_factory=dict)  # from its submission
    not_before_ms: dict[str, int] = field(default_factory=dict)  # set as it is submitted
    cancels: list[PlannedCancel] = field(default_factory=list)
    lost: list[Planned] = field(default_factory=list)  # stored, never sent
    tenant_of: dict[str, str] = field(default_factory=dict)


def mix_size(tasks: int) -> int:
    """How many tasks of a --faults run of `tasks` tasks the scheduling mix holds."""
    return max(30, tasks // 5)


def plan_schedule(count: int, rng: random.Random, side_log: Path) -> SchedulePlan:
    """`count` tasks: about 40 % of the limited tenants (sent first), a fifth delayed, a
    sixth cancelled (every moment in turn), 5 % lost (at least 2)."""
    plan = SchedulePlan()
    limited = list(LIMITS)
    n_lost = max(2, count // 20)
    n_cancel = max(len(MOMENTS), count // 6)
    n_delayed = max(3, count // 5)
    for n in range(count):
        tenant = limited[n % 2] if rng.random() < 0.4 else OPEN_TENANT
        # The limited tenants' tasks run longer, so their queues outlast the bound.
        seconds = rng.uniform(1.5, 3.0) if tenant in LIMITS else rng.uniform(0.2, 1.2)
        payload: dict[str, Any] = {"side_log": str(side_log), "seconds": seconds}
        kind: Kind = rng.choice(["ok", "ok", "flaky"])
        delay_ms = 0
        moment: Moment | None = None
        if n < n_cancel:
            moment = MOMENTS[n % len(MOMENTS)]
            kind = "cancel"
            if moment == "queued":
                tenant = "chaos-lim-b"  # behind its one seat: still queued when cancelled
            elif moment == "running":
                payload["seconds"] = rng.uniform(2.0, 4.0)
            elif moment == "racing":
                # Its first attempt fails (retryably) just after the cancel lands: the
                # flag must win over the retry.
                payload["seconds"], payload["mode"] = rng.uniform(0.8, 1.5), "flaky"
            elif moment == "retrying":
                payload["mode"] = "flaky"
            elif moment == "delayed":
                delay_ms = int(rng.uniform(15_000, 30_000))
        elif n < n_cancel + n_delayed:
            # A few long ones: past the reconciler's bound and several visibility timeouts.
            delay_ms = int(
                rng.uniform(25_000, 45_000) if n % 4 == 0 else rng.uniform(5_000, 15_000)
            )
        if kind == "flaky":
            payload["mode"] = "flaky"
        rid = f"chaos-s-{uuid.uuid4().hex[:14]}"
        envelope = TaskEnvelope(request_id=rid, tenant=tenant, definition="bench-work",
                                input=payload, priority=rng.choice(PRIORITY_TIERS))  # fmt: skip
        item = Planned(envelope=envelope, kind=kind)
        plan.tenant_of[rid] = tenant
        if moment is not None:
            plan.cancels.append(PlannedCancel(request_id=rid, tenant=tenant, moment=moment,
                                              seconds=float(payload["seconds"])))  # fmt: skip
        if delay_ms:
            plan.delay_ms[rid] = delay_ms
        if moment is None and not delay_ms and len(plan.lost) < n_lost and kind == "ok":
            plan.lost.append(item)
        plan.planned.append(item)
    rng.shuffle(plan.planned)
    # The limited tenants' tasks go first, back to back, so they wait on their seats
    # however slowly a loaded host submits: spread among the rest, on a loaded host each
    # once ran alone, and no message was refused a seat or parked in the whole run.
    plan.planned.sort(key=lambda item: item.envelope.tenant not in LIMITS)
    return plan


class ScheduleMix:
    """Submits the plan (limits first) and cancels at each task's moment, in a thread.
    Uses the harness's own fault-free clients, like a producer outside the test."""

    def __init__(self, stage: Stage, plan: SchedulePlan, side_log: Path) -> None:
        clients = stage.clients
        self._stage = stage
        self._client = AgentqClient(settings=Settings.from_env(stage.env()), sqs=clients["sqs"],
                                    dynamodb=clients["dynamodb"], events=clients["events"],
                                    s3=clients["s3"])  # fmt: skip
        self.plan = plan
        self._side_log = side_log
        self.answers: list[CancelAnswer] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._cancel_loop, name="chaos-cancels",
                                        daemon=True)  # fmt: skip
        self._sent_at: dict[str, float] = {}

    def start(self, visibility_timeout_s: int) -> None:
        sqs = self._stage.sqs
        for url in self._stage.resources.tier_queues.values():
            sqs.set_queue_attributes(QueueUrl=url, Attributes={
                "VisibilityTimeout": str(visibility_timeout_s)})  # fmt: skip
        limits = TenantLimitStore(self._stage.clients["dynamodb"], self._stage.resources.table_name)
        for tenant, limit in LIMITS.items():
            limits.set(tenant, limit)
        lost = {p.envelope.request_id for p in self.plan.lost}
        submitter = self._client.submitter
        self._thread.start()  # each cancel counts from its own task's submission
        for item in self.plan.planned:
            envelope = item.envelope
            rid = envelope.request_id
            if rid in lost:
                self._client.tasks.create(envelope)  # stored, its message never sent
                continue
            if rid in self.plan.delay_ms:
                envelope = replace(envelope, not_before_ms=now_ms() + self.plan.delay_ms[rid])
                self.plan.not_before_ms[rid] = int(envelope.not_before_ms or 0)
            submitter.submit(envelope)
            self._sent_at[rid] = time.time()
            if rid in self.plan.delay_ms:
                # A second sender's copy, at once and without the delay.
                sqs.send_message(QueueUrl=submitter.queue_for(envelope),
                                 MessageBody=envelope.to_body(),
                                 MessageAttributes=envelope.message_attributes())  # fmt: skip

    def join(self, timeout_s: float = 120.0) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    # -- cancelling --------------------------------------------------------------------
    def _cancel_loop(self) -> None:
        waiting = list(self.plan.cancels)
        while waiting and not self._stop.is_set():
            starts = self._starts()
            for cancel in list(waiting):
                if self._due(cancel, starts):
                    waiting.remove(cancel)
                    self._cancel(cancel)
            time.sleep(0.1)

    def _due(self, cancel: PlannedCancel, starts: dict[str, float]) -> bool:
        now, sent = time.time(), self._sent_at.get(cancel.request_id)
        if sent is None:
            return False  # not submitted yet
        if now - sent > MOMENT_WAIT_S or cancel.moment == "queued":
            return True
        if cancel.moment == "delayed":
            return now - sent > 2.0
        started = starts.get(cancel.request_id)
        if cancel.moment == "running":
            return started is not None and now - started > 0.3
        if cancel.moment == "racing":
            return started is not None and now >= started + cancel.seconds - 0.05
        # "retrying": once its first attempt failed (or it ended some other way).
        record = self._client.tasks.get(cancel.tenant, cancel.request_id)
        return record is not None and (record.state is TaskState.RETRYING or record.state.terminal)

    def _cancel(self, cancel: PlannedCancel) -> None:
        outcome: str
        try:
            answers = self._client.cancel(cancel.request_id, tenant=cancel.tenant,
                                          reason="chaos cancel")  # fmt: skip
            outcome, state = answers[0].outcome, answers[0].state
        except NotCancellable as finished:
            outcome, state = "finished", finished.state
        except Exception as error:
            self.errors.append(f"cancel {cancel.request_id}: {type(error).__name__}: {error}")
            outcome, state = "error", ""
        answered_at = time.time()
        record = self._client.tasks.get(cancel.tenant, cancel.request_id)
        self.answers.append(CancelAnswer(request_id=cancel.request_id, moment=cancel.moment,
                                         answered_at=answered_at, outcome=outcome, state=state,
                                         attempt=record.attempt if record else 0))  # fmt: skip

    def _starts(self) -> dict[str, float]:
        """Request id -> the first start line of the side log."""
        found: dict[str, float] = {}
        try:
            text = self._side_log.read_text()
        except FileNotFoundError:
            return found
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written
            if record.get("event") == "start":
                found.setdefault(str(record["requestId"]), float(record["t"]))
        return found
