"""One received message, from validation to settlement.

validate → lock (conditional STATE update) → run the child → decide → upload (to the
attempt's own folder, lease still renewed) → finalize the STATE item by lease token
→ event → delete or back off.
Every path settles the message exactly one way: deleted, made visible later, or left
to the live holder of the task's lease.

The steps live beside it: worker.settle.prepare (validate, lock), worker.settle.refusals (what
settles without running), worker.settle.settler (what an attempt's outcome means) and
worker.settle.outbox (events, and deletes that wait for them); this module runs them in order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentq.checkpoints import next_snapshot
from agentq.config import Settings
from agentq.continuation import transcripts_off_reason
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.store.tasks import Lease, TaskStore
from worker.child.env import child_environment
from worker.child.isolation import ChildUser
from worker.child.runner import TASK_FILE
from worker.child.spares import SparePool
from worker.child.supervisor import ChildExit, run_child
from worker.inflight import InFlight, InFlightRegistry
from worker.parking import SeatWaits
from worker.routes import tier_urls
from worker.settle import artifacts
from worker.settle.checkpoints import (
    CheckpointUploader,
    restore,
    restore_source,
    resumable,
)
from worker.settle.outbox import EventSink, Outbox
from worker.settle.outcome import decide
from worker.settle.prepare import Prepared, Preparer
from worker.settle.refusals import CONTENTION_BACKOFF_S, Refusals
from worker.settle.scrub import child_line
from worker.settle.settler import Settler
from worker.sqs.batcher import SqsBatcher
from worker.telemetry import Middleware, Result, TaskEnd, TaskStart

__all__ = ["CONTENTION_BACKOFF_S", "EventSink", "MessageHandler", "Prepared"]

logger = logging.getLogger(__name__)


class MessageHandler:
    def __init__(
        self,
        *,
        settings: Settings,
        store: TaskStore,
        publisher: EventSink,
        batcher: SqsBatcher,
        s3: Any,
        registry: DefinitionRegistry,
        inflight: InFlightRegistry,
        worker_id: str,
        home_dir: Path,
        middleware: Sequence[Middleware] = (),
        environ: Mapping[str, str] | None = None,
        child_user: ChildUser | None = None,
    ) -> None:
        self._settings = settings
        self._child_user = child_user
        self._inflight = inflight
        self._middleware = list(middleware)
        self._outbox = Outbox(publisher=publisher, store=store, batcher=batcher,
                              worker_id=worker_id)  # fmt: skip
        self._store = store
        self._s3 = s3
        self._bucket = settings.required("bucket")
        refusals = Refusals(settings=settings, store=store, batcher=batcher, outbox=self._outbox)
        self._refusals = refusals
        self._preparer = Preparer(
            settings=settings, store=store, batcher=batcher, registry=registry,
            inflight=inflight, worker_id=worker_id, refusals=refusals,
        )  # fmt: skip
        self._settler = Settler(
            settings=settings, store=store, batcher=batcher, inflight=inflight, s3=s3,
            bucket=settings.required("bucket"), worker_id=worker_id, outbox=self._outbox,
        )  # fmt: skip
        self._child_env = child_environment(
            os.environ if environ is None else environ, home=str(home_dir)
        )
        self._bulk_tiers = _bulk_tiers(settings)
        # Spares get the same environment: nothing in it is per task (HOME is per worker).
        self.spares: SparePool | None = None
        if settings.warm_children:
            self.spares = SparePool(
                env=self._child_env,
                size=settings.max_concurrent,
                cwd=home_dir,
                grace_s=settings.kill_grace_ms / 1000,
                warm_agent=settings.warm_agent,
                fork=settings.fork_spares,
                user=child_user,
            )

    # -- entry point -------------------------------------------------------------------
    def handle(
        self,
        message: Mapping[str, Any],
        *,
        entry: InFlight,
        on_child_exit: Callable[[], object] | None = None,
        prepared: Prepared | str | None = None,
    ) -> str:
        """Settle one message; returns a short verdict for logs and tests.

        `entry` is the message's record in the in-flight registry (the consumer adds it
        when the message is received); `prepared` is what `prepare` returned for it
        ahead of time, if it ran; `on_child_exit` runs as soon as the task's child is
        gone, before the settle chain, so the caller can hand the slot to the next task.
        """
        try:
            ready = prepared if prepared is not None else self.prepare(message, entry)
            if isinstance(ready, str):
                return ready
            if self._cancelled_before_start(ready, waited=prepared is not None):
                return self._cancel_unstarted(ready)
            return self._run(ready, on_child_exit or _nothing)
        finally:
            if not entry.awaiting_delete:
                self._inflight.remove(entry)

    def limited_tenant(self, message: Mapping[str, Any]) -> str | None:
        """Its tenant, if that has a concurrency limit: it is locked before it takes a
        slot (worker.receive.placement)."""
        return self._preparer.limited_tenant(message)

    def waits_for_seat(self, message: Mapping[str, Any]) -> bool:
        """Whether `message` is a task this worker knows, due now (no request)."""
        return self._preparer.waits_for_seat(message)

    def waiting(self, message: Mapping[str, Any]) -> None:
        """`message` goes back to its queue unlocked, its tenant at its limit: its task
        is marked waiting (agentq.store.waiting)."""
        self._refusals.waiting(message)

    def prepare(
        self, message: Mapping[str, Any], entry: InFlight, seats: SeatWaits | None = None
    ) -> Prepared | str:
        """Validate and lock: a task ready to run, or the verdict that settled it.

        A prefetched message is prepared while it waits for a slot, so the lock's round
        trip is off the slot's path; its lease is renewed by the heartbeat meanwhile.
        With `seats`, a refusal for its tenant's limit parks it first (worker.parking).
        """
        return self._preparer.prepare(message, entry, seats)

    def unprepare(self, prepared: Prepared) -> None:
        """A prepared task that will not start here (drain): give its lock back.

        Nothing ran and no event said it started, so the attempt is not counted and no
        event is sent; the message becomes visible again for any worker.
        """
        self._preparer.unprepare(prepared)

    # -- the attempt -----------------------------------------------------------------------
    def _cancelled_before_start(self, ready: Prepared, *, waited: bool) -> bool:
        """Whether a cancel was requested for this attempt before its child started.

        A heartbeat that saw the flag has said so on the stop signal. A task locked
        ahead of its slot (`waited`: prefetched or gated) may have been flagged since
        the last beat: one strongly consistent read tells, so its task code never
        begins. A task locked just now needs none: the lock refuses a flagged task.
        """
        if ready.entry.stop.reason == "cancelled":
            return True
        if not waited or ready.entry.stop.is_set():
            return False
        lease = ready.entry.lease or ready.lease
        try:
            record = self._store.get(lease.tenant, lease.request_id)
        except Exception:
            # Unreadable now: start it; a cancel is still seen by the next heartbeat.
            logger.warning("reading the task before its start failed",
                           extra={"requestId": lease.request_id}, exc_info=True)  # fmt: skip
            return False
        return (
            record is not None
            and record.lease_token == lease.token
            and bool(record.raw.get("cancelRequested"))
        )

    def _cancel_unstarted(self, ready: Prepared) -> str:
        """End a locked attempt whose cancel came before its child started: CANCELLED,
        no `Task Processing Started`, no child, the message deleted."""
        entry = ready.entry
        lease = entry.lease or ready.lease
        entry.lease = None  # nothing renews it any more
        entry.stop.set("cancelled")
        forget = functools.partial(self._inflight.remove, entry)
        if self._refusals.cancel_held(entry, ready.envelope, lease, forget):
            return "cancelled"
        return "lease_lost"  # its lease lapses; the next lock meets the flag and ends it

    def _run(self, ready: Prepared, on_child_exit: Callable[[], object]) -> str:
        entry, envelope, definition = ready.entry, ready.envelope, ready.definition
        if entry.stop.reason == "lease_lost":
            # A prefetched lock lost while it waited (a renewal found a newer holder):
            # that attempt is not ours to start, nor its message ours to touch.
            return "lease_lost"
        lease = entry.lease or ready.lease  # renewed by the heartbeat while it waited
        attributes, max_attempts = ready.attributes, ready.max_attempts
        sent = attributes.get("SentTimestamp")
        # A message without a priority has its queue's tier: the attempt's events say
        # which, so `agentq stats` counts every task under its tier.
        tier = envelope.priority or entry.tier or self._settings.default_priority
        if envelope.priority is None:
            envelope = dataclasses.replace(envelope, priority=tier)
        start = TaskStart(
            request_id=envelope.request_id,
            tenant=envelope.tenant,
            definition=definition.name,
            attempt=lease.attempt,
            queue_wait_ms=max(0, now_ms() - int(sent)) if sent else None,
            tier=tier,
            lock_ms=ready.lock_ms,
        )
        self._outbox.emit("Task Processing Started", envelope=envelope, attempt=lease.attempt,
                          effective_until_ms=lease.effective_until_ms,
                          workerSlots=self._settings.max_concurrent)  # fmt: skip
        for middleware in self._middleware:
            _safely(middleware.before_process, start)
        began = time.monotonic()
        task_dir: Path | None = None
        result: Result = "failed"
        try:
            # Anything raised from here on leaves the message unsettled: SQS redelivers it
            # once the lease has expired, and the STATE item counts the attempt.
            stored = self._transcripts_stored(envelope, definition)
            task_dir, offered = self._write_task(envelope, definition, lease, stored)
            uploader = (
                self._checkpoints(envelope, definition, lease, task_dir, entry, offered)
                if stored
                else None
            )
            try:
                child = self._run_child(ready, task_dir, envelope, tier)
            finally:
                if uploader is not None:
                    uploader.stop()  # the last turn uploaded before the attempt settles
            # The lease stays with the heartbeat until the settler's finalize: the upload
            # between may be slow, and a lapsed lease there would invite a takeover.
            _safely(lambda _: on_child_exit(), None)
            outcome = decide(child, task_dir, attempt=lease.attempt, max_attempts=max_attempts)
            if uploader is not None:
                outcome = dataclasses.replace(outcome, checkpoint=uploader.final_key)
            elif not stored:
                outcome = dataclasses.replace(outcome, transcripts_off=True)
            try:
                result = self._settler.settle(
                    entry, envelope, lease, task_dir, outcome, child.duration_ms,
                    max_attempts=max_attempts,
                )  # fmt: skip
            except Exception:
                if not outcome.fenced:
                    raise
                # Fenced because DynamoDB could not be reached, and still unreachable: the
                # lease lapses and the message comes back, as for a lost lease.
                logger.exception("a fenced attempt could not be settled",
                                 extra={"requestId": lease.request_id})  # fmt: skip
                result = "lease_lost"
        finally:
            entry.lease = None  # whatever happened, nothing renews this attempt any more
            if task_dir is not None and self._settings.delete_files_after_upload:
                artifacts.remove(task_dir)
            end = TaskEnd(start=start, result=result,
                          duration_ms=int((time.monotonic() - began) * 1000))  # fmt: skip
            for middleware in self._middleware:
                _safely(middleware.after_process, end)
        return result

    def _run_child(
        self, ready: Prepared, task_dir: Path, envelope: TaskEnvelope, tier: str
    ) -> ChildExit:
        entry = ready.entry
        return run_child(
            task_dir,
            env=self._child_env,
            timeout_s=ready.timeout_ms / 1000,
            grace_s=self._settings.kill_grace_ms / 1000,
            stop=entry.stop,
            log_line=lambda stream, line: logger.info(
                f"[task:{envelope.request_id}] {child_line(line)}",
                extra={"requestId": envelope.request_id, "stream": stream},
            ),
            on_start=lambda pid: setattr(entry, "child_pid", pid),
            spares=self.spares,
            kind=ready.definition.kind,
            bulk=tier in self._bulk_tiers,
            user=self._child_user,
        )

    def _checkpoints(
        self,
        envelope: TaskEnvelope,
        definition: TaskDefinition,
        lease: Lease,
        task_dir: Path,
        entry: InFlight,
        offered: Mapping[str, Any] | None,
    ) -> CheckpointUploader | None:
        """The uploader of a resumable agent task's session checkpoints (None otherwise)."""
        if not _resumes(envelope, definition):
            return None
        rerun = offered is not None and offered.get("from_attempt") == lease.attempt
        return CheckpointUploader(
            self._s3, self._bucket, lease, task_dir,
            interval_s=self._settings.checkpoint_interval_ms / 1000,
            allowed=lambda: entry.stop.reason != "lease_lost",
            # Attempt n run again (an operator's retry): its parts follow the earlier run's.
            first_part=next_snapshot(int(offered.get("parts") or 0)) if offered and rerun else 1,
        ).start()  # fmt: skip

    def _transcripts_stored(self, envelope: TaskEnvelope, definition: TaskDefinition) -> bool:
        """Whether this task's session may be stored (checkpoints, resume, continue): its
        tenant's setting, through the limits' cache (one read per tenant per 30 s), asked
        only of a task that would store one. Unknown (unreadable) stores nothing."""
        if not (_resumes(envelope, definition) or envelope.continues):
            return True
        return self._preparer.transcripts(envelope.tenant) is True

    def _write_task(
        self, envelope: TaskEnvelope, definition: TaskDefinition, lease: Lease, stored: bool = True
    ) -> tuple[Path, Mapping[str, Any] | None]:
        """The task dir with its task.json, and what the child is offered to resume from."""
        task_dir = Path(
            tempfile.mkdtemp(prefix=f"agentq-{envelope.request_id[:40]}-",
                             dir=self._settings.work_dir)
        )  # fmt: skip
        task = {
            "requestId": envelope.request_id,
            "tenant": envelope.tenant,
            "attempt": lease.attempt,
            "leaseToken": lease.token,  # with attempt, the task code's fencing token
            "jobId": envelope.job_id,
            "definition": _as_run(envelope, definition),
            "input": dict(envelope.input),
        }
        if not stored:
            # Nothing read, nothing written: the child keeps no checkpoint either.
            task["resume"] = {"off": transcripts_off_reason(envelope.tenant)}
        elif _resumes(envelope, definition):
            # The child holds no AWS credentials: the worker fetches what it resumes from.
            task["resume"] = restore(
                self._s3, self._bucket, tenant=lease.tenant, request_id=lease.request_id,
                attempt=lease.attempt, task_dir=task_dir,
            )  # fmt: skip
        if envelope.continues is not None:
            task["followUp"] = envelope.prompt
            own = task.get("resume")
            if not (isinstance(own, dict) and own.get("from_attempt")):
                # No checkpoint of its own yet: it starts from the source's final one.
                task["resume"] = (
                    self._continued(envelope, definition, lease, task_dir)
                    if stored
                    else self._not_continued(envelope.tenant)
                )
        (task_dir / TASK_FILE).write_text(json.dumps(task))
        if self._child_user is not None:
            self._child_user.hand_over(task_dir)
        resume = task.get("resume")
        return task_dir, resume if isinstance(resume, dict) else None

    def _not_continued(self, tenant: str) -> dict[str, Any]:
        if self._preparer.transcripts(tenant) is None:
            # Its tenant's settings could not be read: a retry reads them again.
            return {"unreadable": f"the settings of tenant {tenant} could not be read"}
        return {"refused": transcripts_off_reason(tenant)}

    def _continued(
        self, envelope: TaskEnvelope, definition: TaskDefinition, lease: Lease, task_dir: Path
    ) -> dict[str, Any]:
        source_id = str(envelope.continues)
        if definition.kind != "agent":
            return {"refused": "only an agent task can continue another"}
        # Under this task's tenant: another tenant's task of that id is never read.
        source = self._store.get(lease.tenant, source_id)
        return restore_source(self._s3, self._bucket, source=source, source_id=source_id,
                              task_dir=task_dir)  # fmt: skip


def _resumes(envelope: TaskEnvelope, definition: TaskDefinition) -> bool:
    """Whether this task resumes: its own `resume` when set, else its definition's."""
    return resumable(definition.kind, definition.settings, envelope.resume)


def _as_run(envelope: TaskEnvelope, definition: TaskDefinition) -> dict[str, Any]:
    """The definition as task.json gives it to the child: an agent task's own `resume`
    replaces its definition's, so the child's spec says what the worker does."""
    data = definition.to_dict()
    if definition.kind == "agent" and envelope.resume is not None:
        data["settings"] = {**data.get("settings", {}), "resume": envelope.resume}
    return data


def _nothing() -> None:
    return None


def _safely(hook: Any, arg: Any) -> None:
    try:
        hook(arg)
    except Exception:
        logger.exception("middleware hook failed")


def _bulk_tiers(settings: Settings) -> frozenset[str]:
    """The tiers received from the lowest of several queues: their tasks leave warm
    spares to the tiers above (worker.child.spares). None with one queue for every tier."""
    distinct = list(tier_urls(settings).values())
    if len(distinct) < 2:
        return frozenset()
    return frozenset(t for t, url in settings.tier_queue_urls().items() if url == distinct[-1])
