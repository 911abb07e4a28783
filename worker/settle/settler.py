"""Settling a finished attempt: decide what its outcome means for the task and its
message, by lease token.

Outputs go to S3 first, into the attempt's own folder
(`task/{tenant}/{requestId}/attempt-{n}/`); then the STATE item's final write (fenced by
the lease token) names those objects and carries the terminal event, which is published
before the message is deleted (the outbox, worker.settle.outbox). A completed attempt whose
outputs could not be stored is not COMPLETED (its pointer would name nothing): it is a
retryable `server` failure of the attempt, FAILED on the last one. A stale holder can
upload only into its own attempt's folder and its finalize is refused, so the STATE item
never names a loser's objects. The lease is renewed by the heartbeat until that write: a
slow upload does not invite a takeover. A retry is finalized `RETRYING` and its message
made visible after the backoff; a lost lease touches neither the task nor its message. A
shutdown's release keeps the attempt's number but costs no budget, and requeues a fresh
copy of the message, so the interrupted attempt spends none of the queue's receives.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.errors import CancelRequested, LeaseLost
from agentq.events import DetailType, now_ms
from agentq.states import TaskState
from agentq.store.records import ATTEMPT_ALLOWANCE
from agentq.store.tasks import Lease, TaskStore
from agentq.store.tenants import TRANSCRIPTS_OFF
from agentq.taxonomy import ErrorInfo, info
from worker.child.runner import RESULT_FILE
from worker.inflight import InFlight, InFlightRegistry
from worker.settle import artifacts
from worker.settle.outbox import Outbox
from worker.settle.outcome import Outcome, backoff_s
from worker.sqs.batcher import SqsBatcher
from worker.telemetry import Result

logger = logging.getLogger(__name__)


class Settler:
    def __init__(
        self,
        *,
        settings: Settings,
        store: TaskStore,
        batcher: SqsBatcher,
        inflight: InFlightRegistry,
        s3: Any,
        bucket: str,
        worker_id: str,
        outbox: Outbox,
    ) -> None:
        self._settings = settings
        self._store = store
        self._batcher = batcher
        self._inflight = inflight
        self._s3 = s3
        self._bucket = bucket
        self._worker_id = worker_id
        self._outbox = outbox

    def settle(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        lease: Lease,
        task_dir: Path,
        outcome: Outcome,
        duration_ms: int,
        *,
        max_attempts: int,
    ) -> Result:
        if outcome.verdict == "lease_lost":
            # A newer attempt owns the task and its message: touch neither.
            entry.lease = None
            logger.warning(
                "lease lost mid-task; child stopped", extra={"requestId": lease.request_id}
            )
            return "lease_lost"
        if outcome.verdict == "released":
            return self._release(entry, envelope, lease, max_attempts, outcome.error)
        if outcome.fenced:
            # Before its files could overwrite a newer attempt's: is the lease still ours?
            try:
                lease = self._store.renew(lease, lease_seconds=self._settings.lease_seconds)
            except CancelRequested:
                pass  # still ours: the outcome already decided stands
            except LeaseLost:
                entry.lease = None
                logger.warning("lease lost mid-task; child stopped",
                               extra={"requestId": lease.request_id})  # fmt: skip
                return "lease_lost"
            logger.warning("child stopped over an unconfirmed lease, which was still ours",
                           extra={"requestId": lease.request_id})  # fmt: skip
        prefix = artifacts.attempt_prefix(lease.tenant, lease.request_id, lease.attempt)
        try:
            artifacts.upload_outputs(self._s3, self._bucket, prefix, task_dir)
        except Exception:
            logger.exception("artifact upload failed", extra={"requestId": lease.request_id})
            if outcome.verdict == "completed":
                # The result must be stored before COMPLETED names it.
                stored = info("server", "the task's outputs could not be stored", "UploadFailed")
                outcome = Outcome(verdict="retry" if lease.attempt < max_attempts else "failed",
                                  error=stored, usage=outcome.usage)  # fmt: skip
        # Renewals end here, not at the child's exit: until now a slow upload kept the
        # lease, and from here the finalize ends it (a renewal after it would be refused).
        entry.lease = None
        usage = outcome.usage or {}
        fields: dict[str, Any] = {
            "durationMs": duration_ms,
            "artifacts": {"bucket": self._bucket, "prefix": prefix},
        }
        if usage:
            fields.update(usage=usage.get("usage"), costUsd=usage.get("cost_usd"))
        error = outcome.error.to_record() if outcome.error else None
        # An agent attempt's session: resumed from which attempt, or started afresh and why.
        resumed = {"resume": usage["resume"]} if usage.get("resume") else {}

        def emit(detail_type: DetailType, **payload: Any) -> None:
            self._outbox.emit(detail_type, envelope=envelope, attempt=lease.attempt,
                              duration_ms=duration_ms, **resumed, **payload)  # fmt: skip

        def finish(state: TaskState, detail_type: DetailType, **payload: Any) -> None:
            # Outbox: the terminal event rides on the STATE item's final write, and the
            # message goes only once the event is sent. A crash in between brings the
            # message back as a duplicate, which sends the same event (same id) again.
            event = self._outbox.event(detail_type, envelope=envelope, attempt=lease.attempt,
                                       duration_ms=duration_ms, **resumed, **payload)  # fmt: skip
            extra = {"result": payload["result"]} if "result" in payload else {}
            if error is not None:
                extra["error"] = error
            self._outbox.finish(entry, lease, state, event, fields={**fields, **extra},
                                forget=functools.partial(self._inflight.remove, entry))  # fmt: skip

        try:
            if outcome.verdict == "completed":
                pointer = {"bucket": self._bucket, "key": prefix + RESULT_FILE}
                if outcome.checkpoint is not None:
                    # Beside the result, in the same fenced write: what a continuation reads.
                    fields["checkpoint"] = {"bucket": self._bucket, "key": outcome.checkpoint}
                if outcome.transcripts_off:
                    fields["transcripts"] = TRANSCRIPTS_OFF
                finish(TaskState.COMPLETED, "Task Completed", result=pointer,
                       usage=usage.get("usage"), cost_usd=usage.get("cost_usd"))  # fmt: skip
                return "completed"
            if outcome.verdict == "retry":
                delay = backoff_s(lease.attempt, base_s=self._settings.retry_backoff_base_s,
                                  max_s=self._settings.retry_backoff_max_s)  # fmt: skip
                retry_at = now_ms() + int(delay * 1000)
                try:
                    self._store.end_attempt(lease, TaskState.RETRYING, retry_at_ms=retry_at,
                                            fields={**fields, "error": error})  # fmt: skip
                except CancelRequested:
                    # Cancelled while it ran, before a heartbeat could stop it: no retry.
                    self._outbox.cancel_instead(
                        entry, envelope, lease, duration_ms=duration_ms,
                        fields={**fields, "error": error},
                        forget=functools.partial(self._inflight.remove, entry),
                    )  # fmt: skip
                    return "cancelled"
                emit("Task Processing Failed", error=error, retryAt=retry_at)
                # In place, within SQS's 12 hours of this receive (else it is rejected and
                # the message lapses at its last extension, earlier still).
                self._batcher.change_visibility(
                    entry.receipt_handle, entry.within_visibility_room(delay)
                )
                return "retrying"
            if outcome.verdict == "cancelled":
                finish(TaskState.CANCELLED, "Task Cancelled", reason="cancel requested",
                       task_key=envelope.task_key)  # fmt: skip
                return "cancelled"
            timed_out = outcome.verdict == "timeout"
            state = TaskState.TIMEOUT if timed_out else TaskState.FAILED
            detail: DetailType = "Task Timeout" if timed_out else "Task Failed"
            finish(state, detail, error=error)
            return "timeout" if outcome.verdict == "timeout" else "failed"
        except LeaseLost:
            logger.warning("lease lost before finalize; leaving the task to its new holder",
                           extra={"requestId": lease.request_id})  # fmt: skip
            return "lease_lost"

    def _release(
        self,
        entry: InFlight,
        envelope: TaskEnvelope,
        lease: Lease,
        max_attempts: int,
        error: ErrorInfo | None = None,
    ) -> Result:
        """Shutdown stopped the child, or its lease ran short before it could start:
        RETRYING, and the message back as a fresh copy (a release in place would spend
        one of the queue's receives, and enough of them dead-letter a task with
        attempts left).

        Its attempt number stays spent: task code may have seen it (with the lease
        token, its fencing token), `Task Processing Started` named it, and a cancel
        answered now must be answered at it. The attempt was interrupted, not failed,
        so it costs no budget: the allowance admits one more lock."""
        entry.lease = None
        try:
            self._store.end_attempt(
                lease, TaskState.RETRYING, retry_at_ms=now_ms(),
                fields={ATTEMPT_ALLOWANCE: lease.attempt_budget(max_attempts) + 1,
                        "releasedBy": self._worker_id},
            )  # fmt: skip
            if error is None:
                error = info("timeout", "worker shut down before the task finished",
                             "WorkerShutdown")  # fmt: skip
            self._outbox.emit("Task Processing Failed", envelope=envelope, attempt=lease.attempt,
                              error=error.to_record(), retryAt=now_ms())  # fmt: skip
        except CancelRequested:
            # Cancelled while it ran: it ends here, and its message goes (never back).
            try:
                self._outbox.cancel_instead(
                    entry, envelope, lease,
                    forget=functools.partial(self._inflight.remove, entry),
                )  # fmt: skip
                return "cancelled"
            except Exception:
                # Its lease lapses; the next lock meets the flag and ends it CANCELLED.
                logger.exception("cancelling a stopped task failed",
                                 extra={"requestId": lease.request_id})  # fmt: skip
        except LeaseLost:
            # A newer attempt owns the task. Giving the message back anyway is harmless:
            # if it was the holder's, the copy meets the holder's lease like a duplicate.
            pass
        except Exception:
            # The message must still come back now; the lease lapses on its own.
            logger.exception("releasing a stopped task failed",
                             extra={"requestId": lease.request_id})  # fmt: skip
        self._batcher.give_back(entry.receipt_handle, entry.message)
        return "released"
