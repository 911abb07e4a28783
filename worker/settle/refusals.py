"""Messages that settle without running: bad input, refused locks, too many receives.

Bad input is reported (`Task Failed`) and deleted, never redelivered in a loop. A
refused lock backs off or, for a task already finished or out of attempts, ends with
the terminal event first and the delete after it (the outbox, worker.settle.outbox). A task
whose lease is live elsewhere is never deleted here: the message may be its holder's.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from agentq.config import Settings
from agentq.envelope import TaskEnvelope, identity_hint
from agentq.errors import (
    AttemptsExhausted,
    CancelPending,
    InvalidInput,
    LockNotAcquired,
    NotFound,
    TaskAlreadyTerminal,
    TaskHeldElsewhere,
    TaskNotReady,
    TenantAtLimit,
)
from agentq.events import REJECTED_REASON, Event, now_ms
from agentq.schedule import remaining_s
from agentq.states import TaskState
from agentq.store import scheduling
from agentq.store.tasks import Lease, TaskRecord, TaskStore
from agentq.store.waiting import mark_every_s
from agentq.taxonomy import ErrorInfo, classify_exception, info
from worker.inflight import InFlight
from worker.settle.outbox import Outbox
from worker.settle.outcome import backoff_s
from worker.sqs.batcher import SqsBatcher

logger = logging.getLogger(__name__)

# A lock refused for an unclear reason (a concurrent change) is looked at again soon.
CONTENTION_BACKOFF_S: Final = 5.0
BACKING_OFF_LINE: Final = "tenant at its concurrency limit; backing off"
_LIVE: Final = (TaskState.SCHEDULED, TaskState.PENDING, TaskState.RETRYING, TaskState.PROCESSING)


class Refusals:
    def __init__(
        self, *, settings: Settings, store: TaskStore, batcher: SqsBatcher, outbox: Outbox
    ) -> None:
        self._settings = settings
        self._store = store
        self._batcher = batcher
        self._outbox = outbox
        # A task sent back for its tenant's limit is marked waiting, so the reconciler
        # does not count it lost while its message goes round (agentq.store.waiting).
        self.waits = store.wait_marks(every_s=mark_every_s(settings.reconcile_lost_after_s))

    def waiting(self, message: Mapping[str, Any]) -> None:
        """`message` goes back to its queue to wait for its tenant's seat: mark its task."""
        request_id, tenant = self._best_identity(message)
        if request_id is not None:
            self.waits.mark(tenant, request_id)

    def reject(
        self, message: Mapping[str, Any], exc: Exception, entry: InFlight | None = None
    ) -> str:
        """Bad input (or a definition this worker does not know): `Task Failed` and delete,
        never a redelivery loop; but only for a task this message may still end.

        A task already finished keeps its own ending (its stored terminal event goes out
        again), and a task another worker holds keeps its message: during a rolling
        deploy that worker may know a definition this one does not.
        """
        request_id, tenant = self._best_identity(message)
        error = classify_exception(exc)
        if isinstance(exc, NotFound):
            error = info("not_found", str(exc), type(exc).__name__)
        logger.warning(
            "message rejected",
            extra={"requestId": request_id, "messageId": message["MessageId"],
                   "error": error.message},
        )  # fmt: skip
        delete = functools.partial(self._batcher.delete, message["ReceiptHandle"])
        event = self._outbox.event(
            "Task Failed",
            request_id=request_id or _message_request_id(message["MessageId"]),
            tenant=tenant,
            error=error.to_record(),
            reason=REJECTED_REASON,
            messageId=message["MessageId"],
        )
        current = self._store.get(tenant, request_id) if request_id is not None else None
        if current is None:
            # No task to close: report and drop. A crash before the delete brings the
            # message back and it is rejected (and reported) again, never silently lost.
            self._outbox.publish(event, then=delete)
            return "rejected"
        # A producer may have written a PENDING STATE item: close it, with the event
        # (carrying the job, so dependents hear of it) stored before it is published.
        event = replace(event, job_id=current.job_id, attempt=current.attempt,
                        definition=current.definition)  # fmt: skip
        closed = self._store.transition(
            tenant, request_id or "",
            from_states=(TaskState.SCHEDULED, TaskState.PENDING, TaskState.RETRYING),
            to_state=TaskState.FAILED,
            fields={"error": error.to_record(), "terminalEvent": event.to_detail()},
            unless_lease_live=True,
        )  # fmt: skip
        if closed is not None:
            self._outbox.publish(event, then=delete)
            return "rejected"
        now = self._store.get(tenant, request_id or "")
        if now is not None and now.state.terminal:
            self._resend_stored_then(now, delete)
            return "duplicate"
        # Live elsewhere, or blocked: not this message's to end, and never delete it.
        delay = CONTENTION_BACKOFF_S
        if now is not None and now.lease_live():
            delay = max(0.0, ((now.effective_until_ms or 0) - now_ms()) / 1000)
            delay += random.uniform(1.0, 3.0)
        if entry is not None:
            self._back_off(entry, delay, message)
        else:
            self._batcher.change_visibility(message["ReceiptHandle"], delay)
        return "held_elsewhere"

    def _resend_stored_then(self, record: TaskRecord, then: Callable[[], object]) -> None:
        stored = record.raw.get("terminalEvent")
        try:
            event = Event.from_detail(stored) if isinstance(stored, Mapping) else None
        except InvalidInput:
            event = None
        if event is None:
            then()
            return
        self._outbox.publish(event, then=then)

    def _best_identity(self, message: Mapping[str, Any]) -> tuple[str | None, str]:
        # Only an unambiguous, valid id may touch a STATE item; the reader never raises,
        # whatever the body holds (a NaN, 10,000 brackets, a lone surrogate).
        request_id, tenant = identity_hint(
            message.get("Body", ""), message.get("MessageAttributes")
        )
        return request_id, tenant or self._settings.tenant_id

    def too_many_receives(
        self, entry: InFlight, envelope: TaskEnvelope, receives: int, message: Mapping[str, Any]
    ) -> str | None:
        """SQS redelivered this message more often than attempts allow.

        Receives are not attempts (contention counts too), so a task whose lease is live
        is left to its holder; otherwise the task ends here instead of looping.
        """
        record = self._store.get(envelope.tenant, envelope.request_id)
        if record is not None and record.lease_live():
            return self.refused(
                entry,
                envelope,
                TaskHeldElsewhere(
                    envelope.request_id, record.owner, record.effective_until_ms or 0
                ),
                message=message,
            )
        if record is not None and record.state.terminal:
            self._outbox.resend_terminal_event_then_delete(entry, envelope)
            return "duplicate"
        error = info("validation", f"message received {receives} times", "MaxReceivesExceeded")
        self._fail_without_lease(
            entry, envelope, error, attempt=record.attempt if record else 0,
            reason="max receives exceeded",
        )  # fmt: skip
        return "failed"

    def refused(
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
            self._outbox.resend_terminal_event_then_delete(entry, envelope)
            return "duplicate"
        if isinstance(refusal, CancelPending):
            if scheduling.cancel_orphan(self._store, envelope.tenant, envelope.request_id):
                # No attempt holds it and a cancel was requested: it ends, never reruns.
                logger.info("cancel requested and no attempt holds the task; cancelled",
                            extra=log)  # fmt: skip
                self._outbox.resend_terminal_event_then_delete(entry, envelope)
                return "cancelled"
            self._back_off(entry, random.uniform(1, CONTENTION_BACKOFF_S), message)
            return "contended"
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
        if isinstance(refusal, TenantAtLimit):
            # The slot goes to other work; the task waits as a fresh copy, so neither an
            # attempt nor a receive is spent however long its tenant stays at its limit.
            base = self._settings.tenant_limit_backoff_ms / 1000
            delay = random.uniform(base / 2, base)
            logger.info(BACKING_OFF_LINE,
                        extra={**log, "tenant": refusal.tenant, "limit": refusal.limit,
                               "delay_s": delay})  # fmt: skip
            self._back_off(entry, delay, message, always_fresh=True)
            self.waits.mark(envelope.tenant, envelope.request_id)
            return "tenant_limit"
        if isinstance(refusal, TaskNotReady):
            delay = backoff_s(3, base_s=self._settings.retry_backoff_base_s,
                              max_s=self._settings.retry_backoff_max_s)  # fmt: skip
            if refusal.not_before_ms is not None:
                record = scheduling.not_yet_due(self._store, envelope)
                if record.state.terminal:  # cancelled while it waited
                    self._outbox.resend_terminal_event_then_delete(entry, envelope)
                    return "duplicate"
                # Delayed past what SQS DelaySeconds holds: wait out the rest invisible,
                # with no attempt spent (the lock was never taken). As long as SQS allows
                # for this receive (12 hours from it): a longer wait is several re-delays,
                # one receive of the message and one of its fresh copy per 12 hours.
                due = max(refusal.not_before_ms, int(record.raw.get("notBefore") or 0))
                wait = remaining_s(due, now_ms())
                delay = entry.within_visibility_room(
                    min(max(wait, 0.5), self._settings.max_redelay_s)
                )
                logger.info("task not due yet; re-delayed", extra={**log, "delay_s": delay})
            self._back_off(entry, delay, message)
            return "not_ready"
        self._back_off(entry, random.uniform(1, CONTENTION_BACKOFF_S), message)
        return "contended"

    def cancel_held(
        self, entry: InFlight, envelope: TaskEnvelope, lease: Lease, forget: Callable[[], object]
    ) -> bool:
        """A locked task whose cancel was requested before its child started (or while
        it waited to be given back): end it CANCELLED and delete its message. False if
        that failed (logged): its lease then lapses and the next lock ends it."""
        try:
            self._outbox.cancel_instead(entry, envelope, lease, forget=forget)
        except Exception:
            logger.exception("cancelling a held task failed",
                             extra={"requestId": envelope.request_id})  # fmt: skip
            return False
        logger.info("cancel requested before the task started; cancelled",
                    extra={"requestId": envelope.request_id})  # fmt: skip
        return True

    def _back_off(
        self,
        entry: InFlight,
        delay_s: float,
        message: Mapping[str, Any] | None,
        *,
        always_fresh: bool = False,
    ) -> None:
        """Look at a task again later without running it now.

        Every receive counts toward the queue's maxReceiveCount, attempt or not: a
        message that backs off more than once (a takeover after a crash, a duplicate
        of a long task) would be dead-lettered with attempts left. From its second
        receive on it is requeued as a fresh copy instead; the STATE item, not the
        receive count, decides how often the task runs. `always_fresh`: from the first,
        for a wait that may repeat many times (a tenant at its limit).
        """
        receives = int((message or {}).get("Attributes", {}).get("ApproximateReceiveCount", 1))
        fresh = message is not None and (receives > 1 or always_fresh)
        if fresh:
            logger.info("backing off: requeued as a fresh copy",
                        extra={"requestId": entry.request_id, "receives": receives})  # fmt: skip
        # Settled here: the heartbeat must not extend it any more, or its next beat would
        # replace this back-off with a short extension (a prepared-ahead message stays in
        # the registry until a slot takes it). And no longer than SQS allows for this
        # receive: a rejected change would leave it visible in a few seconds.
        entry.extending = False
        delay_s = entry.within_visibility_room(delay_s)
        self._batcher.give_back(entry.receipt_handle, message, delay_s, fresh=fresh)

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
        event = self._outbox.event("Task Failed", envelope=envelope, attempt=attempt,
                                   error=error.to_record(), reason=reason)  # fmt: skip
        record = self._store.transition(
            envelope.tenant, envelope.request_id, from_states=_LIVE, to_state=TaskState.FAILED,
            fields={"error": error.to_record(), "reason": reason,
                    "terminalEvent": event.to_detail()},
            unless_lease_live=True,
        )  # fmt: skip
        if record is None and self._store.get(envelope.tenant, envelope.request_id) is not None:
            # Someone else moved it first (it is live or terminal now): leave it to them.
            entry.extending = False
            self._batcher.change_visibility(entry.receipt_handle, CONTENTION_BACKOFF_S)
            return
        self._outbox.publish(
            event, then=functools.partial(self._batcher.delete, entry.receipt_handle)
        )


def _message_request_id(message_id: str) -> str:
    return "msg-" + "".join(c for c in message_id if c.isalnum() or c in "-_")[:250]
