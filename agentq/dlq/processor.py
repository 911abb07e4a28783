"""The dead-letter processor: close out and redrive messages from the task DLQ.

SQS moves a message to the DLQ after `maxReceiveCount` receives; no code runs then.
`DlqProcessor.process` (called by the dlq-processor Lambda for each record) archives
the original body and attributes to S3 first (agentq/dlq/archive.py), so nothing is
lost whatever happens next. A task that still has attempts left is sent back to the
task queue, a bounded number of times (agentq/dlq/returns.py); otherwise the task is
marked FAILED unless it is terminal already or a live lease says a worker still runs
it, and exactly one `Task Failed` is emitted (only when the transition happened).
`redrive` replays an archived message onto the task queue with a fresh attempt budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from agentq.dlq.archive import (
    ArchivedMessage,
    DeadLetter,
    DlqArchive,
    DlqOutcome,
    archive_key,
)
from agentq.dlq.malformed import close_out_malformed
from agentq.dlq.returns import DlqReturner
from agentq.envelope import TENANT_PATTERN, TaskEnvelope, parse_message
from agentq.errors import InvalidInput
from agentq.events import Event, event_of, now_ms
from agentq.publisher import EventPublisher
from agentq.states import LIVE_STATES, TaskState
from agentq.store import TaskRecord, TaskStore

__all__ = ["DLQ_REASON", "DlqProcessor", "DlqResult", "RedriveResult", "Redriver"]

DLQ_REASON: Final = "max retries exhausted, moved to DLQ"
UNPARSED_TENANT: Final = "_unparsed"

RedriveOutcome = Literal["redriven", "skipped"]


@dataclass(frozen=True, kw_only=True)
class DlqResult:
    message_id: str
    request_id: str | None
    outcome: DlqOutcome
    archive_key: str
    detail: str | None = None


class DlqProcessor:
    """Closes out dead letters. Clients and stores are passed in."""

    def __init__(
        self,
        *,
        tasks: TaskStore,
        archive: DlqArchive,
        publisher: EventPublisher,
        default_tenant: str,
        returner: DlqReturner | None = None,
    ) -> None:
        self._tasks = tasks
        self._archive = archive
        self._publisher = publisher
        self._default_tenant = default_tenant
        # None: every dead letter is closed out (a caller without the task queue).
        self._returner = returner

    def process(self, letter: DeadLetter) -> DlqResult:
        try:
            envelope: TaskEnvelope | None = parse_message(
                letter.body, letter.attributes, default_tenant=self._default_tenant
            )
        except InvalidInput as exc:
            envelope, problem = None, str(exc)
        tenant = envelope.tenant if envelope else UNPARSED_TENANT
        request_id = envelope.request_id if envelope else letter.request_id_hint()
        archived = ArchivedMessage(
            key=archive_key(tenant, request_id or "_unknown", letter.message_id),
            message_id=letter.message_id,
            request_id=request_id,
            tenant=envelope.tenant if envelope else None,
            body=letter.body,
            attributes=letter.attributes,
            system_attributes=letter.system_attributes,
            archived_at_ms=now_ms(),
        )
        # Archive before anything else: if a later step fails, the message is safe.
        self._archive.put(archived)
        if envelope is None:
            if request_id is not None:
                problem = close_out_malformed(
                    self._tasks, self._publisher, letter.body, letter.attributes,
                    request_id=request_id, message_id=letter.message_id, problem=problem,
                    default_tenant=self._default_tenant,
                )  # fmt: skip
            return self._record(archived, "malformed", problem)
        outcome, detail = self._close_out(envelope, letter)
        return self._record(archived, outcome, detail)

    def _close_out(
        self, envelope: TaskEnvelope, letter: DeadLetter
    ) -> tuple[DlqOutcome, str | None]:
        before = self._tasks.get(envelope.tenant, envelope.request_id)
        if before is None:
            # A producer that sent without writing the STATE item: create it (rare, the
            # only PutItem here) so the conditional transition below decides once.
            before, _ = self._tasks.create(envelope)
        if self._returner is not None:
            returned = self._returner.give_back(before, letter)
            if returned is not None:
                return "returned", returned
        if not before.state.terminal and before.lease_live(now_ms()):
            # Its holder may still settle it, or die and leave attempts to return it for:
            # decide once the lease is over. Closing out now could meet a lease that
            # lapsed since this read and fail a task the return above would have kept.
            return "lease-live", f"left to its holder {before.owner}"
        error = {
            "category": _last_category(before),
            "retryable": False,
            "message": DLQ_REASON,
            "reason": "dlq",
        }
        event = event_of("Task Failed", before, error=error, reason=DLQ_REASON)
        # The event is stored with the transition, then published: if PutEvents fails or
        # this Lambda dies in between, its retry finds the task terminal and re-sends the
        # stored event (same id, deduplicated downstream), so the job still hears of it.
        record = self._tasks.transition(
            envelope.tenant,
            envelope.request_id,
            from_states=LIVE_STATES,
            to_state=TaskState.FAILED,
            unless_lease_live=True,
            fields={"error": error, "terminalEvent": event.to_detail()},
        )
        if record is None:
            now = self._tasks.require(envelope.tenant, envelope.request_id)
            if now.state.terminal:
                self._resend_terminal_event(now)
                return "already-terminal", f"task is {now.state.value}"
            return "lease-live", f"left to its holder {now.owner}"
        self._publisher.publish(event)
        return "failed", DLQ_REASON

    def _resend_terminal_event(self, record: TaskRecord) -> None:
        """A worker may have died between finalizing the task and sending its terminal
        event, and the message's receives ran out before another worker could re-send
        it. The event stored on the STATE item goes out again with its own id, which
        save-event and the dispatcher deduplicate."""
        stored = record.raw.get("terminalEvent")
        if not isinstance(stored, Mapping):
            return
        try:
            event = Event.from_detail(stored)
        except InvalidInput:
            return
        self._publisher.publish(event)

    def _record(
        self, archived: ArchivedMessage, outcome: DlqOutcome, detail: str | None
    ) -> DlqResult:
        self._archive.put(replace(archived, outcome=outcome, detail=detail))
        return DlqResult(
            message_id=archived.message_id,
            request_id=archived.request_id,
            outcome=outcome,
            archive_key=archived.key,
            detail=detail,
        )


def _last_category(record: TaskRecord) -> str:
    previous = record.raw.get("error")
    if isinstance(previous, Mapping) and isinstance(previous.get("category"), str):
        return str(previous["category"])
    return "server"


@dataclass(frozen=True, kw_only=True)
class RedriveResult:
    request_id: str | None
    archive_key: str
    outcome: RedriveOutcome
    detail: str
    message_id: str | None = None


class Redriver:
    """Replays archived dead letters onto the task queue with a fresh attempt budget."""

    def __init__(
        self,
        *,
        sqs: Any,
        queue_url: str,
        tasks: TaskStore,
        archive: DlqArchive,
        publisher: EventPublisher | None = None,
    ) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._tasks = tasks
        self._archive = archive
        self._publisher = publisher

    def redrive(self, message: ArchivedMessage, *, again: bool = False) -> RedriveResult:
        """Replay one message. Skips (with the reason) rather than raising."""

        def skipped(detail: str) -> RedriveResult:
            return RedriveResult(request_id=message.request_id, archive_key=message.key,
                                 outcome="skipped", detail=detail)  # fmt: skip

        if message.tenant is None or message.request_id is None:
            return skipped("malformed message: nothing to replay (kept in the archive)")
        if message.redriven_at_ms is not None and not again:
            return skipped("already redriven")
        record = self._tasks.get(message.tenant, message.request_id)
        if record is not None:
            if record.state in (TaskState.COMPLETED, TaskState.CANCELLED):
                return skipped(f"task is {record.state.value}; not re-running finished work")
            reset = self._tasks.reset_for_redrive(message.tenant, message.request_id)
            if reset is None:
                return skipped("task has a live lease; a worker is running it")
        sent = self._sqs.send_message(
            QueueUrl=self._queue_url,
            MessageBody=message.body,
            MessageAttributes=message.send_attributes(),
            # The tenant as MessageGroupId, like every agentq send (SQS fair queues).
            **(
                {"MessageGroupId": message.tenant}
                if TENANT_PATTERN.fullmatch(message.tenant)
                else {}
            ),
        )
        self._archive.mark_redriven(message)
        if self._publisher is not None and record is not None:
            self._publisher.publish(
                event_of(
                    "Task Pending",
                    record,
                    attempt=0,
                    redriven=True,
                    dlqMessageId=message.message_id,
                )
            )
        return RedriveResult(
            request_id=message.request_id,
            archive_key=message.key,
            outcome="redriven",
            detail="replayed onto the task queue with a fresh attempt budget",
            message_id=str(sent["MessageId"]),
        )

    def redrive_request(self, request_id: str) -> list[RedriveResult]:
        """Replay the newest not-yet-redriven archived message of one task."""
        return self._redrive_groups(self._archive.list(request_id=request_id))

    def redrive_all(self) -> list[RedriveResult]:
        """Replay every task that has archived messages not redriven yet."""
        return self._redrive_groups(self._archive.list())

    def _redrive_groups(self, messages: list[ArchivedMessage]) -> list[RedriveResult]:
        # One replay per task: its newest message. Older copies of the same task are
        # marked redriven with it, so a later `--all` does not run the task twice.
        groups: dict[tuple[str, str], list[ArchivedMessage]] = {}
        results: list[RedriveResult] = []
        for message in messages:  # oldest first
            if message.redriven_at_ms is not None:
                continue
            if message.request_id is None or message.tenant is None:
                results.append(self.redrive(message))
                continue
            groups.setdefault((message.tenant, message.request_id), []).append(message)
        for group in groups.values():
            result = self.redrive(group[-1])
            if result.outcome == "redriven":
                for older in group[:-1]:
                    self._archive.mark_redriven(older)
            results.append(result)
        return results
