"""One received message, from validation to settlement.

validate → lock (conditional STATE update) → run the child → decide → upload →
finalize the STATE item by lease token → event → delete or back off.
Every path settles the message exactly one way: deleted, made visible later, or left
to the live holder of the task's lease.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from agentq.config import Settings
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import REQUEST_ID_PATTERN, TENANT_PATTERN, TaskEnvelope, parse_message
from agentq.errors import (
    AttemptsExhausted,
    InvalidInput,
    LeaseLost,
    LockNotAcquired,
    NotFound,
    TaskAlreadyTerminal,
    TaskHeldElsewhere,
    TaskNotReady,
)
from agentq.events import DetailType, Event, now_ms, task_event
from agentq.states import TaskState
from agentq.store.tasks import Lease, TaskStore
from agentq.taxonomy import ErrorInfo, classify_exception, info
from worker import artifacts
from worker.batcher import SqsBatcher
from worker.child import RESULT_FILE, TASK_FILE
from worker.childenv import child_environment
from worker.inflight import InFlight, InFlightRegistry
from worker.leasefile import lease_times
from worker.outcome import Outcome, backoff_s, decide
from worker.spares import SparePool
from worker.supervisor import run_child
from worker.telemetry import Middleware, Result, TaskEnd, TaskStart

logger = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where task events go (an `EventBatcher`); `then` runs once the event is sent,
    `otherwise` if it could not be."""

    def publish(
        self,
        event: Event,
        /,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None: ...


# A lock refused for an unclear reason (a concurrent change) is looked at again soon.
CONTENTION_BACKOFF_S: Final = 5.0
_LIVE: Final = (TaskState.PENDING, TaskState.RETRYING, TaskState.PROCESSING)


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
    ) -> None:
        self._settings = settings
        self._store = store
        self._publisher = publisher
        self._batcher = batcher
        self._s3 = s3
        self._bucket = settings.required("bucket")
        self._registry = registry
        self._inflight = inflight
        self._worker_id = worker_id
        self._middleware = list(middleware)
        self._child_env = child_environment(
            os.environ if environ is None else environ, home=str(home_dir)
        )
        # Spares get the same environment: nothing in it is per task (HOME is per worker).
        self.spares: SparePool | None = None
        if settings.warm_children:
            self.spares = SparePool(
                env=self._child_env,
                size=settings.max_concurrent,
                cwd=home_dir,
                grace_s=settings.kill_grace_ms / 1000,
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
            return self._run(ready, on_child_exit or _nothing)
        finally:
            if not entry.awaiting_delete:
                self._inflight.remove(entry)

    def prepare(self, message: Mapping[str, Any], entry: InFlight) -> Prepared | str:
        """Validate and lock: a task ready to run, or the verdict that settled it.

        A prefetched message is prepared while it waits for a slot, so the lock's round
        trip is off the slot's path; its lease is renewed by the heartbeat meanwhile.
        """
        attributes = message.get("Attributes", {})
        try:
            envelope = parse_message(
                message.get("Body", ""),
                message.get("MessageAttributes"),
                default_tenant=self._settings.tenant_id,
            )
            definition = self._registry.get(envelope.definition)
        except (InvalidInput, NotFound) as exc:
            return self._reject(message, exc)
        entry.envelope = envelope
        receives = int(attributes.get("ApproximateReceiveCount", 1))
        if receives > self._settings.max_message_retries:
            verdict = self._too_many_receives(entry, envelope, receives, message)
            if verdict is not None:
                return verdict
        max_attempts = definition.attempts(self._settings.max_message_retries)
        timeout_ms = definition.timeout_ms(self._settings.task_timeout_ms)
        try:
            lease = self._store.acquire(
                envelope,
                worker_id=self._worker_id,
                lease_seconds=self._settings.lease_seconds,
                max_attempts=max_attempts,
                timeout_ms=timeout_ms,
            )
        except LockNotAcquired as refusal:
            return self._refused(entry, envelope, refusal, message=message)
        entry.lease = lease
        # Arms the worker's fence and the child's lease file from the first moment.
        entry.stop.hold(lease_times(lease.effective_until_ms, self._settings))
        return Prepared(entry=entry, envelope=envelope, definition=definition, lease=lease,
                        attributes=attributes, max_attempts=max_attempts,
                        timeout_ms=timeout_ms)  # fmt: skip

    def unprepare(self, prepared: Prepared) -> None:
        """A prepared task that will not start here (drain): give its lock back.

        Nothing ran and no event said it started, so the attempt is not counted and no
        event is sent; the message becomes visible again for any worker.
        """
        entry = prepared.entry
        entry.lease = None
        try:
            self._store.finalize(
                prepared.lease, TaskState.RETRYING, retry_at_ms=now_ms(),
                fields={"attempt": max(0, prepared.lease.attempt - 1),
                        "releasedBy": self._worker_id},
            )  # fmt: skip
        except LeaseLost:
            pass
        finally:
            self._batcher.change_visibility(entry.receipt_handle, 0)
            self._inflight.remove(entry)

    # -- before the lock -----------------------------------------------------------------
    def _reject(self, message: Mapping[str, Any], exc: Exception) -> str:
        """Bad input: `Task Failed` (validation) and delete; never a redelivery loop."""
        request_id, tenant = self._best_identity(message)
        error = classify_exception(exc)
        if isinstance(exc, NotFound):
            error = info("not_found", str(exc), type(exc).__name__)
        logger.warning(
            "message rejected",
            extra={"requestId": request_id, "messageId": message["MessageId"],
                   "error": error.message},
        )  # fmt: skip
        if request_id is not None:
            # A producer may have written a PENDING STATE item: close it too.
            self._store.transition(
                tenant, request_id, from_states=(TaskState.PENDING, TaskState.RETRYING),
                to_state=TaskState.FAILED, fields={"error": error.to_record()},
                unless_lease_live=True,
            )  # fmt: skip
        event = self._event(
            "Task Failed",
            request_id=request_id or _message_request_id(message["MessageId"]),
            tenant=tenant,
            error=error.to_record(),
            reason="invalid message",
            messageId=message["MessageId"],
        )
        # Deleted once the event is out: a crash in between brings the message back and
        # it is rejected (and reported) again, never silently lost.
        self._publish(event, then=functools.partial(self._batcher.delete, message["ReceiptHandle"]))
        return "rejected"

    def _best_identity(self, message: Mapping[str, Any]) -> tuple[str | None, str]:
        tenant = self._settings.tenant_id
        candidates: list[object] = []
        attribute = (message.get("MessageAttributes") or {}).get("requestId")
        if isinstance(attribute, Mapping):
            candidates.append(attribute.get("StringValue"))
        try:
            body = json.loads(message.get("Body", ""))
        except ValueError:
            body = None
        if isinstance(body, dict):
            candidates.append(body.get("requestId"))
            body_tenant = body.get("tenant")
            if isinstance(body_tenant, str) and TENANT_PATTERN.fullmatch(body_tenant):
                tenant = body_tenant
        # Only an unambiguous, valid id may touch a STATE item.
        valid = {c for c in candidates if isinstance(c, str) and REQUEST_ID_PATTERN.fullmatch(c)}
        if len(valid) == 1 and all(c in valid or c is None for c in candidates):
            return valid.pop(), tenant
        return None, tenant

    def _too_many_receives(
        self, entry: InFlight, envelope: TaskEnvelope, receives: int, message: Mapping[str, Any]
    ) -> str | None:
        """SQS redelivered this message more often than attempts allow.

        Receives are not attempts (contention counts too), so a task whose lease is live
        is left to its holder; otherwise the task ends here instead of looping.
        """
        record = self._store.get(envelope.tenant, envelope.request_id)
        if record is not None and record.lease_live():
            return self._refused(
                entry,
                envelope,
                TaskHeldElsewhere(
                    envelope.request_id, record.owner, record.effective_until_ms or 0
                ),
                message=message,
            )
        if record is not None and record.state.terminal:
            self._resend_terminal_event_then_delete(entry, envelope)
            return "duplicate"
        error = info("validation", f"message received {receives} times", "MaxReceivesExceeded")
        self._fail_without_lease(
            entry, envelope, error, attempt=record.attempt if record else 0,
            reason="max receives exceeded",
        )  # fmt: skip
        return "failed"

    def _refused(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        refusal: LockNotAcquired,
        *,
        message: Mapping[str, Any] | None = None,
    ) -> str:
        log = {"requestId": envelope.request_id, "refusal": type(refusal).__name__}
        if isinstance(refusal, TaskAlreadyTerminal):
            logger.info("duplicate of a finished task; deleting", extra=log)
            self._resend_terminal_event_then_delete(entry, envelope)
            return "duplicate"
        if isinstance(refusal, TaskHeldElsewhere):
            # Never delete: this may be the holder's own message. Look again after its lease.
            remaining = max(0.0, (refusal.effective_until_ms - now_ms()) / 1000)
            delay = remaining + random.uniform(1.0, 3.0)
            logger.info("task held elsewhere; backing off", extra={**log, "delay_s": delay})
            self._back_off(entry, delay, message)
            return "held_elsewhere"
        if isinstance(refusal, AttemptsExhausted):
            error = info(
                "validation", f"attempts exhausted ({refusal.attempts})", "AttemptsExhausted"
            )
            self._fail_without_lease(
                entry, envelope, error, attempt=refusal.attempts, reason="attempts exhausted"
            )
            return "failed"
        if isinstance(refusal, TaskNotReady):
            delay = backoff_s(3, base_s=self._settings.retry_backoff_base_s,
                              max_s=self._settings.retry_backoff_max_s)  # fmt: skip
            self._back_off(entry, delay, message)
            return "not_ready"
        self._back_off(entry, random.uniform(1, CONTENTION_BACKOFF_S), message)
        return "contended"

    def _back_off(self, entry: InFlight, delay_s: float, message: Mapping[str, Any] | None) -> None:
        """Look at a task again later without running it now.

        Every receive counts toward the queue's maxReceiveCount, attempt or not: a
        message that backs off more than once (a takeover after a crash, a duplicate
        of a long task) would be dead-lettered with attempts left. From its second
        receive on it is requeued as a fresh copy instead; the STATE item, not the
        receive count, decides how often the task runs.
        """
        receives = int((message or {}).get("Attributes", {}).get("ApproximateReceiveCount", 1))
        if message is not None and receives > 1:
            try:
                self._batcher.requeue(message, delay_s)
                logger.info("backing off: requeued as a fresh copy",
                            extra={"requestId": entry.request_id, "receives": receives})  # fmt: skip
                return
            except Exception:
                logger.exception("requeue failed; backing off in place",
                                 extra={"requestId": entry.request_id})  # fmt: skip
        self._batcher.change_visibility(entry.receipt_handle, delay_s)

    def _fail_without_lease(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        error: ErrorInfo,
        *,
        attempt: int,
        reason: str,
    ) -> None:
        # Outbox, as for a finished attempt: the event rides on the STATE item, and the
        # message goes once the event is out (a returning duplicate re-sends it).
        event = self._event("Task Failed", envelope=envelope, attempt=attempt,
                            error=error.to_record(), reason=reason)  # fmt: skip
        record = self._store.transition(
            envelope.tenant, envelope.request_id, from_states=_LIVE, to_state=TaskState.FAILED,
            fields={"error": error.to_record(), "reason": reason,
                    "terminalEvent": event.to_detail()},
            unless_lease_live=True,
        )  # fmt: skip
        if record is None and self._store.get(envelope.tenant, envelope.request_id) is not None:
            # Someone else moved it first (it is live or terminal now): leave it to them.
            self._batcher.change_visibility(entry.receipt_handle, CONTENTION_BACKOFF_S)
            return
        self._publish(event, then=functools.partial(self._batcher.delete, entry.receipt_handle))

    # -- the attempt -----------------------------------------------------------------------
    def _run(self, ready: Prepared, on_child_exit: Callable[[], object]) -> str:
        entry, envelope, definition = ready.entry, ready.envelope, ready.definition
        lease = entry.lease or ready.lease  # renewed by the heartbeat while it waited
        attributes, max_attempts = ready.attributes, ready.max_attempts
        timeout_ms = ready.timeout_ms
        sent = attributes.get("SentTimestamp")
        start = TaskStart(
            request_id=envelope.request_id,
            tenant=envelope.tenant,
            definition=definition.name,
            attempt=lease.attempt,
            queue_wait_ms=max(0, now_ms() - int(sent)) if sent else None,
        )
        self._emit("Task Processing Started", envelope=envelope, attempt=lease.attempt,
                   effective_until_ms=lease.effective_until_ms)  # fmt: skip
        for middleware in self._middleware:
            _safely(middleware.before_process, start)
        began = time.monotonic()
        task_dir: Path | None = None
        result: Result = "failed"
        try:
            # Anything raised from here on leaves the message unsettled: SQS redelivers it
            # once the lease has expired, and the STATE item counts the attempt.
            task_dir = self._prepare(envelope, definition, lease)
            child = run_child(
                task_dir,
                env=self._child_env,
                timeout_s=timeout_ms / 1000,
                grace_s=self._settings.kill_grace_ms / 1000,
                stop=entry.stop,
                log_line=lambda stream, line: logger.info(
                    f"[task:{envelope.request_id}] {line}",
                    extra={"requestId": envelope.request_id, "stream": stream},
                ),
                on_start=lambda pid: setattr(entry, "child_pid", pid),
                spares=self.spares,
                kind=definition.kind,
            )
            entry.lease = None  # the heartbeat stops renewing: the attempt is over
            _safely(lambda _: on_child_exit(), None)
            outcome = decide(child, task_dir, attempt=lease.attempt, max_attempts=max_attempts)
            try:
                result = self._settle(entry, envelope, lease, task_dir, outcome, child.duration_ms)
            except Exception:
                if not outcome.fenced:
                    raise
                # Fenced because DynamoDB could not be reached, and still unreachable: the
                # lease lapses and the message comes back, as for a lost lease.
                logger.exception("a fenced attempt could not be settled",
                                 extra={"requestId": lease.request_id})  # fmt: skip
                result = "lease_lost"
        finally:
            if task_dir is not None and self._settings.delete_files_after_upload:
                artifacts.remove(task_dir)
            end = TaskEnd(start=start, result=result,
                          duration_ms=int((time.monotonic() - began) * 1000))  # fmt: skip
            for middleware in self._middleware:
                _safely(middleware.after_process, end)
        return result

    def _prepare(self, envelope: TaskEnvelope, definition: TaskDefinition, lease: Lease) -> Path:
        task_dir = Path(
            tempfile.mkdtemp(prefix=f"agentq-{envelope.request_id[:40]}-",
                             dir=self._settings.work_dir)
        )  # fmt: skip
        task = {
            "requestId": envelope.request_id,
            "tenant": envelope.tenant,
            "attempt": lease.attempt,
            "jobId": envelope.job_id,
            "definition": definition.to_dict(),
            "input": dict(envelope.input),
        }
        (task_dir / TASK_FILE).write_text(json.dumps(task))
        return task_dir

    def _settle(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        lease: Lease,
        task_dir: Path,
        outcome: Outcome,
        duration_ms: int,
    ) -> Result:
        if outcome.verdict == "lease_lost":
            # A newer attempt owns the task and its message: touch neither.
            logger.warning(
                "lease lost mid-task; child stopped", extra={"requestId": lease.request_id}
            )
            return "lease_lost"
        if outcome.verdict == "released":
            return self._release(entry, envelope, lease)
        if outcome.fenced:
            # Before its files could overwrite a newer attempt's: is the lease still ours?
            try:
                lease = self._store.renew(lease, lease_seconds=self._settings.lease_seconds)
            except LeaseLost:
                logger.warning("lease lost mid-task; child stopped",
                               extra={"requestId": lease.request_id})  # fmt: skip
                return "lease_lost"
            logger.warning("child stopped over an unconfirmed lease, which was still ours",
                           extra={"requestId": lease.request_id})  # fmt: skip
        try:
            artifacts.upload_outputs(self._s3, self._bucket, envelope.request_id, task_dir)
        except Exception:
            logger.exception("artifact upload failed", extra={"requestId": lease.request_id})
        usage = outcome.usage or {}
        fields: dict[str, Any] = {"durationMs": duration_ms}
        if usage:
            fields.update(usage=usage.get("usage"), costUsd=usage.get("cost_usd"))
        error = outcome.error.to_record() if outcome.error else None

        def emit(detail_type: DetailType, **payload: Any) -> None:
            self._emit(detail_type, envelope=envelope, attempt=lease.attempt,
                       duration_ms=duration_ms, **payload)  # fmt: skip

        def finish(state: TaskState, detail_type: DetailType, **payload: Any) -> None:
            # Outbox: the terminal event rides on the STATE item's final write, and the
            # message goes only once the event is sent. A crash in between brings the
            # message back as a duplicate, which sends the same event (same id) again.
            event = self._event(detail_type, envelope=envelope, attempt=lease.attempt,
                                duration_ms=duration_ms, **payload)  # fmt: skip
            extra = {"result": payload["result"]} if "result" in payload else {}
            if error is not None:
                extra["error"] = error
            self._store.finalize(lease, state, fields={
                **fields, **extra, "terminalEvent": event.to_detail()})  # fmt: skip
            # The heartbeat keeps the message invisible until the delete is sent (the
            # event and delete batches may take longer than one visibility extension).
            entry.awaiting_delete = True
            forget = functools.partial(self._inflight.remove, entry)
            self._publish(
                event,
                then=lambda: self._batcher.delete(entry.receipt_handle, then=forget),
                otherwise=forget,
            )

        try:
            if outcome.verdict == "completed":
                pointer = {"bucket": self._bucket,
                           "key": artifacts.prefix_for(envelope.request_id) + RESULT_FILE}  # fmt: skip
                finish(TaskState.COMPLETED, "Task Completed", result=pointer,
                       usage=usage.get("usage"), cost_usd=usage.get("cost_usd"))  # fmt: skip
                return "completed"
            if outcome.verdict == "retry":
                delay = backoff_s(lease.attempt, base_s=self._settings.retry_backoff_base_s,
                                  max_s=self._settings.retry_backoff_max_s)  # fmt: skip
                retry_at = now_ms() + int(delay * 1000)
                self._store.finalize(lease, TaskState.RETRYING, retry_at_ms=retry_at,
                                     fields={**fields, "error": error})  # fmt: skip
                emit("Task Processing Failed", error=error, retryAt=retry_at)
                self._batcher.change_visibility(entry.receipt_handle, delay)
                return "retrying"
            timed_out = outcome.verdict == "timeout"
            state = TaskState.TIMEOUT if timed_out else TaskState.FAILED
            detail: DetailType = "Task Timeout" if timed_out else "Task Failed"
            finish(state, detail, error=error)
            return "timeout" if outcome.verdict == "timeout" else "failed"
        except LeaseLost:
            logger.warning("lease lost before finalize; leaving the task to its new holder",
                           extra={"requestId": lease.request_id})  # fmt: skip
            return "lease_lost"

    def _release(self, entry: InFlight, envelope: TaskEnvelope, lease: Lease) -> Result:
        """Shutdown stopped the child: give the attempt back and make the message visible."""
        try:
            self._store.finalize(
                lease, TaskState.RETRYING, retry_at_ms=now_ms(),
                # The attempt did not fail; it was interrupted: do not count it.
                fields={"attempt": max(0, lease.attempt - 1), "releasedBy": self._worker_id},
            )  # fmt: skip
            error = info("timeout", "worker shut down before the task finished", "WorkerShutdown")
            self._emit("Task Processing Failed", envelope=envelope, attempt=lease.attempt,
                       error=error.to_record(), retryAt=now_ms())  # fmt: skip
        except LeaseLost:
            pass
        self._batcher.change_visibility(entry.receipt_handle, 0)
        return "released"

    # -- events --------------------------------------------------------------------------
    def _emit(self, detail_type: DetailType, **fields: Any) -> None:
        """Build (see `_event`) and publish a task event."""
        self._publish(self._event(detail_type, **fields))

    def _event(
        self,
        detail_type: DetailType,
        *,
        envelope: TaskEnvelope | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        attempt: int = 0,
        effective_until_ms: int | None = None,
        **payload: Any,
    ) -> Event:
        return task_event(
            detail_type,
            request_id=envelope.request_id if envelope else str(request_id),
            tenant=envelope.tenant if envelope else str(tenant),
            job_id=envelope.job_id if envelope else None,
            attempt=attempt,
            worker_id=self._worker_id,
            definition=envelope.definition if envelope else None,
            effective_until_ms=effective_until_ms,
            **payload,
        )

    def _publish(
        self,
        event: Event,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None:
        try:
            self._publisher.publish(event, then=then, otherwise=otherwise)
        except Exception:
            # The STATE item already holds the truth; a lost event must not undo the work.
            logger.exception("event not published", extra={"detailType": event.detail_type})
            if otherwise is not None:
                otherwise()

    def _resend_terminal_event_then_delete(self, entry: InFlight, envelope: TaskEnvelope) -> None:
        """A finished task's message came back: make sure its terminal event went out.

        The event stored on the STATE item keeps its id and time, so save-event and the
        dispatcher see a duplicate, not a second ending.
        """
        record = self._store.get(envelope.tenant, envelope.request_id)
        stored = record.raw.get("terminalEvent") if record is not None else None
        delete = functools.partial(self._batcher.delete, entry.receipt_handle)
        if not isinstance(stored, Mapping):
            delete()
            return
        try:
            event = Event.from_detail(stored)
        except InvalidInput:
            logger.warning(
                "unreadable stored terminal event", extra={"requestId": envelope.request_id}
            )
            delete()
            return
        self._publish(event, then=delete)


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A validated, locked task waiting for its child."""

    entry: InFlight
    envelope: TaskEnvelope
    definition: TaskDefinition
    lease: Lease
    attributes: Mapping[str, Any]
    max_attempts: int
    timeout_ms: int


def _message_request_id(message_id: str) -> str:
    return "msg-" + "".join(c for c in message_id if c.isalnum() or c in "-_")[:250]


def _nothing() -> None:
    return None


def _safely(hook: Any, arg: Any) -> None:
    try:
        hook(arg)
    except Exception:
        logger.exception("middleware hook failed")
