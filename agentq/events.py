"""The event vocabulary: detail types, the fields every event carries, and builders.

An event's `detail` (camelCase JSON, as it appears on EventBridge and in the table):

    eventId, detailType, requestId, tenant, jobId, attempt, workerId, state,
    effectiveUntil (epoch ms or null), timestamp (ISO 8601 UTC), definition, payload

`payload` is type-specific: error (category, retryable, message), result pointer,
usage and cost. A payload too large for EventBridge is replaced by `payloadPointer`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol, get_args

from agentq.config.light import clock_offset_ms
from agentq.envelope import validate_request_id
from agentq.errors import InvalidInput, UnknownEventType
from agentq.states import TaskState

DetailType = Literal[
    "Task Requested",
    "Task Pending",
    "Task Processing Started",
    "Task Heartbeat",
    "Task Processing Failed",
    "Task Completed",
    "Task Failed",
    "Task Timeout",
    "Task Cancelled",
    "Task Repaired",
    "Job Completed",
    "Job Failed",
    "Job Repaired",
    # An operator's console action (redrive, discard, cancel, resubmit), with who did it.
    "Operator Action",
    "Job Operator Action",
]
DETAIL_TYPES: Final[tuple[DetailType, ...]] = get_args(DetailType)


def standalone_request_id(event: Mapping[str, Any]) -> str | None:
    """The request id of a task on its own (not in a job) that a stored task event names,
    whatever the producer path: agentq's producers store `Task Pending`, a task sent on
    the bus `Task Requested`, and a raw SQS message's first event is its worker's."""
    if event.get("jobId") or not str(event.get("detailType") or "").startswith("Task "):
        return None
    request_id = event.get("requestId")
    return request_id if isinstance(request_id, str) and request_id else None


# The state a task is in once the event has happened (None: not a task state change).
STATE_AFTER: Final[dict[DetailType, TaskState | None]] = {
    "Task Requested": None,
    "Task Pending": TaskState.PENDING,
    "Task Processing Started": TaskState.PROCESSING,
    "Task Heartbeat": TaskState.PROCESSING,
    "Task Processing Failed": TaskState.RETRYING,
    "Task Completed": TaskState.COMPLETED,
    "Task Failed": TaskState.FAILED,
    "Task Timeout": TaskState.TIMEOUT,
    "Task Cancelled": TaskState.CANCELLED,
    # The reconciler re-sent a lost message; the state itself did not change.
    "Task Repaired": None,
    "Job Completed": None,
    "Job Failed": None,
    "Job Repaired": None,
    "Operator Action": None,
    "Job Operator Action": None,
}
# The `reason` of the `Task Failed` a worker sends for a message it rejects unread (no
# STATE item exists for it; `agentq status` answers from this event).
REJECTED_REASON: Final = "invalid message"


def now_ms() -> int:
    # The offset is 0 outside the chaos harness, which skews some workers' clocks.
    return int(datetime.now(UTC).timestamp() * 1000) + clock_offset_ms()


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def parse_detail_type(value: str) -> DetailType:
    if value not in DETAIL_TYPES:
        raise UnknownEventType(value)
    return value  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class Event:
    detail_type: DetailType
    request_id: str
    tenant: str
    timestamp_ms: int = field(default_factory=now_ms)
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    job_id: str | None = None
    attempt: int = 0
    worker_id: str | None = None
    definition: str | None = None
    effective_until_ms: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    payload_pointer: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        parse_detail_type(self.detail_type)
        if self.detail_type.startswith("Job"):
            if not self.job_id:
                raise InvalidInput("jobId", f"a {self.detail_type} event needs a job id")
        else:
            validate_request_id(self.request_id)
        state = STATE_AFTER[self.detail_type]
        if state is not None and state.terminal and self.effective_until_ms is not None:
            raise InvalidInput("effectiveUntil", "terminal states never expire")

    @property
    def state(self) -> TaskState | None:
        return STATE_AFTER[self.detail_type]

    @property
    def timestamp(self) -> str:
        return iso_ms(self.timestamp_ms)

    def to_detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {
            "eventId": self.event_id,
            "detailType": self.detail_type,
            "requestId": self.request_id,
            "tenant": self.tenant,
            "jobId": self.job_id,
            "attempt": self.attempt,
            "workerId": self.worker_id,
            "definition": self.definition,
            "state": self.state.value if self.state else None,
            "effectiveUntil": self.effective_until_ms,
            "timestamp": self.timestamp,
            "timestampMs": self.timestamp_ms,
            "payload": dict(self.payload),
        }
        if self.job_id is None:
            # EventBridge `exists` matching treats null as present; omit instead.
            del detail["jobId"]
        if self.payload_pointer is not None:
            detail["payload"] = {}
            detail["payloadPointer"] = dict(self.payload_pointer)
        return detail

    def to_entry(self, *, source: str, bus_name: str) -> dict[str, Any]:
        return {
            "Source": source,
            "DetailType": self.detail_type,
            "Detail": json.dumps(self.to_detail(), separators=(",", ":"), default=str),
            "EventBusName": bus_name,
            "Time": datetime.fromtimestamp(self.timestamp_ms / 1000, UTC),
        }

    def with_pointer(self, pointer: Mapping[str, Any]) -> Event:
        return replace(self, payload={}, payload_pointer=dict(pointer))

    @classmethod
    def from_detail(cls, detail: Mapping[str, Any], detail_type: str | None = None) -> Event:
        """Rebuild an event from its detail (as delivered by EventBridge)."""
        try:
            kind = parse_detail_type(str(detail_type or detail["detailType"]))
            return cls(
                detail_type=kind,
                request_id=str(detail.get("requestId") or ""),
                tenant=str(detail["tenant"]),
                timestamp_ms=int(detail["timestampMs"]),
                event_id=str(detail["eventId"]),
                job_id=detail.get("jobId"),
                attempt=int(detail.get("attempt") or 0),
                worker_id=detail.get("workerId"),
                definition=detail.get("definition"),
                effective_until_ms=detail.get("effectiveUntil"),
                payload=dict(detail.get("payload") or {}),
                payload_pointer=detail.get("payloadPointer"),
            )
        except KeyError as missing:
            raise InvalidInput(str(missing.args[0]), "missing from event detail") from None
        except (TypeError, ValueError) as bad:
            raise InvalidInput("detail", f"malformed event detail: {bad}") from None


def task_event(
    detail_type: DetailType,
    *,
    request_id: str,
    tenant: str,
    job_id: str | None = None,
    attempt: int = 0,
    worker_id: str | None = None,
    definition: str | None = None,
    effective_until_ms: int | None = None,
    **payload: Any,
) -> Event:
    """Build a task event; keyword arguments beyond the common fields form the payload."""
    return Event(
        detail_type=detail_type,
        request_id=request_id,
        tenant=tenant,
        job_id=job_id,
        attempt=attempt,
        worker_id=worker_id,
        definition=definition,
        effective_until_ms=effective_until_ms,
        payload={k: v for k, v in payload.items() if v is not None},
    )


class TaskIdentity(Protocol):
    """What names a task in its events: a stored record or an envelope."""

    @property
    def request_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def definition(self) -> str | None: ...


def event_of(
    detail_type: DetailType, task: TaskIdentity, *, attempt: int | None = None, **payload: Any
) -> Event:
    """A task event named by `task` (a record's attempt unless `attempt` is given); the
    keyword arguments form the payload."""
    if attempt is None:
        attempt = getattr(task, "attempt", 0)
    return task_event(detail_type, request_id=task.request_id, tenant=task.tenant,
                      job_id=task.job_id, definition=task.definition, attempt=attempt,
                      **payload)  # fmt: skip


def job_event(
    detail_type: Literal["Job Completed", "Job Failed", "Job Repaired"],
    *,
    job_id: str,
    tenant: str,
    **payload: Any,
) -> Event:
    return Event(
        detail_type=detail_type,
        request_id=f"job-{job_id}",
        tenant=tenant,
        job_id=job_id,
        payload=payload,
    )
