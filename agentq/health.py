"""The health check: find stuck, overtime and starving tasks, and a backed-up DLQ.

Every finding comes from the status index (`TaskStore.tasks_by_status`), never a scan:

- stuck: PROCESSING whose lease (`effectiveUntil`) has passed: no heartbeat renewed it.
- overtime: PROCESSING past its `deadlineAt` (the definition's timeout) plus a grace.
- starving: PENDING, or RETRYING past its `retryAt`, for longer than a threshold.
- dlq: messages waiting in the DLQ (the dlq-processor should keep it near empty).
- repaired: the reconciler repaired something (`Task Repaired` / `Job Repaired`
  events, through the byType index). A repair is a healthy outcome of an unhealthy
  event (a lost message, a missed dispatch), so any repair at all is worth a look.

The index is eventually consistent (a write reaches it a moment later): each candidate
it names is read again from its STATE item, strongly consistent, and judged on that,
so a lease renewed or a task finished a moment ago raises nothing. Only candidates are
read, so a healthy fleet costs no extra reads.

`AlertLedger` deduplicates: a finding alerts once per (subject, condition, version),
where the version changes when the situation changes (a new lease, attempt or depth).
The marker is a conditional put, so two overlapping runs alert once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from botocore.exceptions import ClientError

from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import EventStore, TaskRecord, TaskStore
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values

if TYPE_CHECKING:  # the health-check Lambda loads the model with its first invocation
    from agentq.config import Settings

Condition = Literal["stuck", "overtime", "starving", "dlq", "repaired"]
ALERT_PK_PREFIX: Final = "ALERT#"
logger = logging.getLogger(__name__)
_DAY_S: Final = 86_400
_REPAIR_EVENTS: Final = ("Task Repaired", "Job Repaired")


@dataclass(frozen=True, kw_only=True)
class Finding:
    condition: Condition
    subject: str  # request id, or the queue for a DLQ finding
    tenant: str | None
    state: str | None
    age_s: float  # how long the condition has held
    version: str  # what makes this occurrence distinct; a new version alerts again
    summary: str
    last_event: str | None = None
    inspect: str | None = None  # the command that shows more

    @property
    def dedupe_key(self) -> tuple[str, str]:
        return (f"{ALERT_PK_PREFIX}{self.tenant or '-'}#{self.subject}",
                f"{self.condition}#{self.version}")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class QueueHealth:
    depth: int
    in_flight: int
    oldest_age_s: float | None
    age_source: str  # where the age came from: "cloudwatch", "peek" or "none"


@dataclass(frozen=True, kw_only=True)
class HealthReport:
    checked_at_ms: int
    findings: list[Finding]
    dlq: QueueHealth | None

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for finding in self.findings:
            counts[finding.condition] = counts.get(finding.condition, 0) + 1
        return counts


class AlertLedger:
    """Alert markers in the events table (items outside every index)."""

    def __init__(self, dynamodb: Any, table_name: str, *, keep_days: int) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._keep_s = keep_days * _DAY_S

    def claim(self, finding: Finding, *, at_ms: int) -> bool:
        """Record that this finding is being alerted; False if it already was."""
        pk, sk = finding.dedupe_key
        # UpdateItem creates the marker (one conditional write, like PutItem) and can
        # re-claim a released one; the function's role needs no PutItem/DeleteItem.
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"PK": {"S": pk}, "SK": {"S": sk}},
                UpdateExpression=(
                    "SET #condition = :condition, alertedAt = :at, #ttl = :ttl REMOVE released"
                ),
                ConditionExpression="attribute_not_exists(PK) OR released = :true",
                ExpressionAttributeNames={"#condition": "condition", "#ttl": "ttl"},
                ExpressionAttributeValues=values(
                    condition=finding.condition,
                    at=at_ms,
                    ttl=at_ms // 1000 + self._keep_s,
                    true=True,
                ),
            )
        except ClientError as error:
            if condition_failed(error):
                return False
            raise
        return True

    def release(self, finding: Finding) -> None:
        """Give a claim back when its alert could not be delivered: the next run retries."""
        pk, sk = finding.dedupe_key
        self._ddb.update_item(
            TableName=self._table,
            Key={"PK": {"S": pk}, "SK": {"S": sk}},
            UpdateExpression="SET released = :true",
            ExpressionAttributeValues=values(true=True),
        )


class HealthChecker:
    """Runs the checks. Clients and stores are passed in; `now_ms` is a parameter."""

    def __init__(
        self,
        *,
        tasks: TaskStore,
        events: EventStore,
        sqs: Any,
        settings: Settings,
        cloudwatch: Any = None,
    ) -> None:
        self._tasks = tasks
        self._events = events
        self._sqs = sqs
        self._cloudwatch = cloudwatch
        self._settings = settings

    def check(self, *, at_ms: int | None = None) -> HealthReport:
        now = now_ms() if at_ms is None else at_ms
        # One status-index read of PROCESSING serves both checks on running tasks.
        processing = self._tasks.tasks_by_status(TaskState.PROCESSING)
        findings: list[Finding] = []
        findings += self._stuck(processing, now)
        findings += self._overtime(processing, now)
        findings += self._starving(now)
        findings += self._repaired(now)
        dlq = self._dlq_health() if self._settings.dlq_url else None
        if dlq is not None and dlq.depth > 0:
            findings.append(self._dlq_finding(dlq))
        return HealthReport(checked_at_ms=now, findings=findings, dlq=dlq)

    # -- task conditions -----------------------------------------------------------
    def _stuck(self, processing: list[TaskRecord], now: int) -> list[Finding]:
        result = []
        for candidate in processing:
            if candidate.effective_until_ms is None or candidate.effective_until_ms >= now:
                continue
            record = self._current(candidate)
            if record is None or record.effective_until_ms is None:
                continue
            if record.effective_until_ms >= now:
                continue
            expired_at = record.effective_until_ms
            beat = record.raw.get("lastHeartbeatAt")
            result.append(
                self._finding(
                    record,
                    "stuck",
                    age_s=(now - expired_at) / 1000,
                    version=f"{record.attempt}:{expired_at}",
                    summary=(
                        f"no heartbeat since {_ago(now, beat)}; lease of {record.owner} "
                        f"expired {_ago(now, expired_at)}"
                    ),
                )
            )
        return result

    def _overtime(self, processing: list[TaskRecord], now: int) -> list[Finding]:
        grace_ms = self._settings.overtime_grace_s * 1000
        result = []
        for candidate in processing:
            deadline = candidate.raw.get("deadlineAt")
            if not isinstance(deadline, int) or deadline + grace_ms >= now:
                continue
            record = self._current(candidate)
            if record is None or record.raw.get("deadlineAt") != deadline:
                continue
            started = record.raw.get("startedAt")
            result.append(
                self._finding(
                    record,
                    "overtime",
                    age_s=(now - deadline) / 1000,
                    version=f"{record.attempt}:{started}",
                    summary=(
                        f"attempt {record.attempt} started {_ago(now, started)}, "
                        f"past its deadline by {_span((now - deadline) / 1000)}"
                    ),
                )
            )
        return result

    def _starving(self, now: int) -> list[Finding]:
        threshold = now - self._settings.pending_alert_after_s * 1000
        result = []
        for state in (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRYING):
            # Due time is creation (PENDING), notBefore (SCHEDULED: not starving before
            # its time) or the retry time (RETRYING).
            for candidate in self._tasks.tasks_by_status(state, due_before_ms=threshold):
                record = self._current(candidate)
                due = _due_ms(record) if record is not None else None
                if record is None or (due is not None and due >= threshold):
                    continue  # taken, or due again later, since the index saw it
                since = due or record.updated_at_ms or now
                result.append(
                    self._finding(
                        record,
                        "starving",
                        age_s=(now - since) / 1000,
                        version=f"{state.value}:{record.attempt}:{since}",
                        summary=f"{state.value} since {_ago(now, since)}: no worker took it",
                    )
                )
        return result

    def _current(self, candidate: TaskRecord) -> TaskRecord | None:
        """The candidate as its STATE item says now, None if it left the index's state."""
        record = self._tasks.get(candidate.tenant, candidate.request_id)
        return record if record is not None and record.state is candidate.state else None

    def _finding(
        self, record: TaskRecord, condition: Condition, *, age_s: float, version: str, summary: str
    ) -> Finding:
        latest = self._events.latest(record.tenant, record.request_id)
        last_event = f"{latest['detailType']} at {latest['timestamp']}" if latest else None
        return Finding(
            condition=condition,
            subject=record.request_id,
            tenant=record.tenant,
            state=record.state.value,
            age_s=max(age_s, 0.0),
            version=version,
            summary=summary,
            last_event=last_event,
            inspect=f"agentq status {record.request_id} --tenant {record.tenant}",
        )

    def _repaired(self, now: int) -> list[Finding]:
        # Alert markers live as long as this window, so a repair alerts exactly once.
        since = now - self._settings.alert_dedupe_days * _DAY_S * 1000
        result = []
        for detail_type in _REPAIR_EVENTS:
            for event in self._events.events_by_type(detail_type, since_ms=since):
                payload = event.get("payload") or {}
                is_job = detail_type == "Job Repaired"
                subject = str(event.get("jobId") if is_job else event.get("requestId"))
                at = event.get("timestampMs")
                result.append(
                    Finding(
                        condition="repaired",
                        subject=subject,
                        tenant=str(event.get("tenant")),
                        state=str(payload.get("observedState") or ("job" if is_job else "—")),
                        age_s=max((now - at) / 1000, 0.0) if isinstance(at, int) else 0.0,
                        version=str(event.get("eventId")),
                        summary=f"{payload.get('repair', 'repair')}: {payload.get('detail', '')}",
                        last_event=f"{detail_type} at {event.get('timestamp')}",
                        inspect=(
                            f"agentq job status {subject} --tenant {event.get('tenant')}"
                            if is_job
                            else f"agentq status {subject} --tenant {event.get('tenant')}"
                        ),
                    )
                )
        return result

    # -- the DLQ -------------------------------------------------------------------
    def _dlq_health(self) -> QueueHealth:
        url = self._settings.required("dlq_url")
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        depth = int(attributes.get("ApproximateNumberOfMessages", 0))
        in_flight = int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0))
        age, source = (None, "none")
        if depth:
            age, source = self._oldest_age(url)
        return QueueHealth(depth=depth, in_flight=in_flight, oldest_age_s=age, age_source=source)

    def _oldest_age(self, url: str) -> tuple[float | None, str]:
        # On AWS the metric is authoritative and reading it consumes nothing (and the
        # DLQ's receives belong to the dlq-processor). moto has no SQS metrics, so
        # locally we peek (visibility 0) at SentTimestamp instead.
        if not self._settings.local:
            if self._cloudwatch is None:
                return None, "none"
            try:
                age = self._cloudwatch_age(url)
            except ClientError as error:
                logger.warning("DLQ age unavailable from CloudWatch: %s", error)
                return None, "none"
            return (age, "cloudwatch") if age is not None else (None, "none")
        response = self._sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=0,
            WaitTimeSeconds=0,
            AttributeNames=["SentTimestamp"],
        )
        sent = [int(m["Attributes"]["SentTimestamp"]) for m in response.get("Messages", [])]
        if not sent:
            return None, "none"
        return (now_ms() - min(sent)) / 1000, "peek"

    def _cloudwatch_age(self, url: str) -> float | None:
        from datetime import UTC, datetime, timedelta

        end = datetime.now(UTC)
        response = self._cloudwatch.get_metric_statistics(
            Namespace="AWS/SQS",
            MetricName="ApproximateAgeOfOldestMessage",
            Dimensions=[{"Name": "QueueName", "Value": url.rstrip("/").rsplit("/", 1)[-1]}],
            StartTime=end - timedelta(minutes=10),
            EndTime=end,
            Period=300,
            Statistics=["Maximum"],
        )
        points = sorted(response.get("Datapoints", []), key=lambda p: p["Timestamp"])
        return float(points[-1]["Maximum"]) if points else None

    def _dlq_finding(self, dlq: QueueHealth) -> Finding:
        queue = self._settings.required("dlq_url").rstrip("/").rsplit("/", 1)[-1]
        age = f", oldest {_span(dlq.oldest_age_s)}" if dlq.oldest_age_s is not None else ""
        return Finding(
            condition="dlq",
            subject=queue,
            tenant=None,
            state=None,
            age_s=dlq.oldest_age_s or 0.0,
            version=str(dlq.depth),
            summary=f"{dlq.depth} message(s) waiting in the DLQ{age}",
            inspect="agentq dlq list --peek",
        )


def dedupe(findings: Sequence[Finding], ledger: AlertLedger, *, at_ms: int) -> list[Finding]:
    """The findings not alerted before (claiming them)."""
    return [f for f in findings if ledger.claim(f, at_ms=at_ms)]


def _due_ms(record: TaskRecord) -> int | None:
    """The due time the status index sorts by (creation, unblocking or retry time)."""
    sort_key = record.raw.get("statusSK")
    if isinstance(sort_key, str) and sort_key[:15].isdigit():
        return int(sort_key[:15])
    return record.created_at_ms


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _ago(now: int, then: object) -> str:
    return f"{_span((now - then) / 1000)} ago" if isinstance(then, int) else "never"
