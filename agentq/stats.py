"""A stage's figures per priority tier and per tenant over a window: `agentq stats`.

The metrics of seed 000's appendix, read from what the stage already keeps, without
receiving a single message (a receive, even with visibility 0, counts toward a
message's `maxReceiveCount`):

- queue depth, in flight, delayed: each tier queue's and the DLQ's attributes;
- age of the oldest message: SQS's `ApproximateAgeOfOldestMessage` on AWS (one
  `GetMetricData` for every queue); locally (moto keeps no SQS metrics) the oldest
  PENDING task of the tier in the status index, marked `"ageSource": "status-index"`;
- claims, completions, failures, retries, timeouts and processing time p50/p95: the
  worker's events in the window, through the byType index (each worker event names its
  tier in `payload.priority`, and an attempt's end its `payload.duration_ms`);
- consumers: every worker of the roster (agentq.store.workers: busy, idle, gone, with
  slots and version), plus those the `Task Processing Started` events of the window
  name (`payload.workerSlots`); busy slots and last heartbeats from the PROCESSING
  tasks' STATE items.

Requests are bounded: one `GetQueueAttributes` per distinct tier queue and one for the
DLQ, one `GetMetricData` on AWS, one query per event type (5) and per status shard
for PROCESSING and PENDING (8), each followed for at most `MAX_PAGES` pages of 1 MB,
and one roster query. With the default three tiers that is 18 requests locally and 19
on AWS while every query fits in one page; when a query is cut short, `truncated` is
true and its counts are lower bounds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.config import Settings
from agentq.errors import InvalidInput
from agentq.events import iso_ms, now_ms
from agentq.resources import STATUS_SHARDS
from agentq.states import TaskState
from agentq.store import keys
from agentq.store.codec import from_item, values
from agentq.store.workers import WorkerRoster

VERSION: Final = 1
MAX_PAGES: Final = 10
DEFAULT_WINDOW: Final = "15m"
MAX_WINDOW_S: Final = 7 * 86_400
# Event type -> the figure it counts.
COUNTED: Final[dict[str, str]] = {
    "Task Processing Started": "claims",
    "Task Completed": "completions",
    "Task Failed": "failures",
    "Task Processing Failed": "retries",
    "Task Timeout": "timeouts",
}
FIGURES: Final = tuple(COUNTED.values())
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_WINDOW: Final = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_QUEUE_ATTRIBUTES: Final = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]


def parse_window(text: str) -> int:
    """`15m`, `90s`, `2h`, `1d` as seconds (1 s to 7 days)."""
    match = _WINDOW.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput("window", "must be a number and a unit: 90s, 15m, 2h, 1d")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_WINDOW_S:
        raise InvalidInput("window", "must be at most 7d")
    return seconds


def percentile(sorted_values: list[int], fraction: float) -> int | None:
    """Nearest-rank percentile of ascending values (None when there are none)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Figures:
    """One tier's or tenant's counts over the window."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIGURES, 0))
    durations: list[int] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    oldest_waiting_ms: int | None = None

    def waited_since(self, since_ms: int) -> None:
        self.waiting += 1
        if self.oldest_waiting_ms is None or since_ms < self.oldest_waiting_ms:
            self.oldest_waiting_ms = since_ms

    def to_json(self, window_s: int, at_ms: int) -> dict[str, Any]:
        ordered = sorted(self.durations)
        oldest = self.oldest_waiting_ms
        return {
            **self.counts,
            "perMinute": {k: round(v * 60 / window_s, 3) for k, v in self.counts.items()},
            "processingMs": {
                "count": len(ordered),
                "p50": percentile(ordered, 0.5),
                "p95": percentile(ordered, 0.95),
            },
            "running": self.running,
            "waiting": self.waiting,
            "oldestWaitingS": None if oldest is None else round(max(0, at_ms - oldest) / 1000, 1),
        }


class StatsReader:
    """Reads the figures; clients are passed in, `cloudwatch` only where SQS metrics exist."""

    def __init__(
        self,
        settings: Settings,
        *,
        sqs: Any,
        dynamodb: Any,
        cloudwatch: Any = None,
        page_size: int | None = None,
    ) -> None:
        """`page_size`: items per query page (DynamoDB's `Limit`; default: 1 MB pages)."""
        self._settings = settings
        self._page_size = page_size
        self._sqs = sqs
        self._ddb = dynamodb
        self._cloudwatch = None if settings.local else cloudwatch
        self._table = settings.required("table_name")
        self.requests = 0
        self.truncated = False

    def read(self, window_s: int, *, at_ms: int | None = None) -> dict[str, Any]:
        at = now_ms() if at_ms is None else at_ms
        since = at - window_s * 1000
        settings = self._settings
        urls = _distinct(settings.tier_queue_urls())
        if not urls:
            urls = {settings.default_priority: settings.required("queue_url")}
        tiers: dict[str, Figures] = {tier: Figures() for tier in urls}
        tenants: dict[str, Figures] = defaultdict(Figures)
        workers: dict[str, dict[str, Any]] = {}
        default = (
            settings.default_priority if settings.default_priority in urls else next(iter(urls))
        )

        def tier_of(priority: object) -> Figures:
            name = priority if isinstance(priority, str) and priority in tiers else default
            return tiers[name]

        for detail_type, figure in COUNTED.items():
            for event in self._events(detail_type, since, at):
                found = event.get("payload")
                payload: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
                tenant = str(event.get("tenant") or "?")
                groups = (tier_of(payload.get("priority")), tenants[tenant])
                duration = payload.get("duration_ms")
                for group in groups:
                    group.counts[figure] += 1
                    if detail_type != "Task Processing Started" and isinstance(duration, int):
                        group.durations.append(duration)
                if detail_type == "Task Processing Started":
                    _seen_worker(workers, event, payload)
        for record in self._live(TaskState.PROCESSING):
            priority = _priority(record)
            for group in (tier_of(priority), tenants[str(record.get("tenant") or "?")]):
                group.running += 1
            _busy_worker(workers, record, at)
        for record in self._live(TaskState.PENDING):
            since_ms = record.get("createdAt")
            since_ms = since_ms if isinstance(since_ms, int) else at
            for group in (tier_of(_priority(record)), tenants[str(record.get("tenant") or "?")]):
                group.waited_since(since_ms)
        queues = {tier: self._queue(url) for tier, url in urls.items()}
        dlq = self._queue(settings.dlq_url) if settings.dlq_url else None
        ages = self._ages({**urls, **({"(dlq)": settings.dlq_url} if settings.dlq_url else {})})
        tier_rows: list[dict[str, Any]] = []
        for tier, figures in tiers.items():
            row: dict[str, Any] = {"tier": tier, "queue": _queue_name(urls[tier]),
                                   **queues[tier], **figures.to_json(window_s, at)}  # fmt: skip
            if ages is not None:
                row["oldestAgeS"], row["ageSource"] = ages.get(tier), "cloudwatch"
            else:
                row["oldestAgeS"], row["ageSource"] = row["oldestWaitingS"], "status-index"
            tier_rows.append(row)
        dlq_row: dict[str, Any] | None = None
        if dlq is not None:
            dlq_row = {"queue": _queue_name(str(settings.dlq_url)), **dlq,
                       "oldestAgeS": ages.get("(dlq)") if ages is not None else None}  # fmt: skip
        self._merge_roster(workers, at)
        listed = sorted(({k: v for k, v in w.items() if k != "_slotsAt"} for w in workers.values()),
                        key=lambda w: str(w["worker"]))  # fmt: skip
        live = [w for w in listed if w["status"] in LIVE_STATUSES]
        slots = [w["slots"] for w in live if isinstance(w["slots"], int)]
        return {
            "version": VERSION,
            "at": at,
            "stage": settings.stage,
            "windowS": window_s,
            "tiers": tier_rows,
            "tenants": [
                {"tenant": name, **figures.to_json(window_s, at)}
                for name, figures in sorted(tenants.items())
            ],
            "dlq": dlq_row,
            "consumers": {
                "workers": len(live),
                "slots": sum(slots) if len(slots) == len(live) else None,
                "busy": sum(w["busy"] for w in live),
                "idle": sum(1 for w in live if w["status"] == "idle"),
                "gone": sum(1 for w in listed if w["status"] == "gone"),
                "list": listed,
            },
            "requests": self.requests,
            "truncated": self.truncated,
        }

    # -- reads -------------------------------------------------------------------------
    def _merge_roster(self, workers: dict[str, dict[str, Any]], at: int) -> None:
        """Workers from the roster (agentq.store.workers): the idle and the gone, which no
        task names, and every live one's slots and version. A caller without read access
        to it still gets the workers the events and tasks name."""
        self.requests += 1
        try:
            entries = WorkerRoster(self._ddb, self._table).entries()
        except ClientError:
            return
        for entry in entries:
            status = entry.status(at)
            if status == "stopped" and entry.worker not in workers:
                continue  # ended cleanly and names no task: nothing to show
            row = workers.setdefault(entry.worker, _worker(entry.worker))
            row.update(slots=entry.slots, version=entry.version, lastSeenMs=entry.seen_ms)
            row["status"] = "busy" if row["busy"] and status != "gone" else status

    def _queue(self, url: str) -> dict[str, int]:
        self.requests += 1
        attributes = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=_QUEUE_ATTRIBUTES)[
            "Attributes"
        ]
        return {
            "depth": int(attributes.get("ApproximateNumberOfMessages", 0)),
            "inFlight": int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
            "delayed": int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
        }

    def _ages(self, urls: Mapping[str, str]) -> dict[str, float | None] | None:
        """Each queue's oldest message age (s) from SQS's metric; None off AWS."""
        if self._cloudwatch is None:
            return None
        ids = {f"q{n}": name for n, name in enumerate(urls)}
        # The end a minute ahead: the current minute's datapoint is the one wanted.
        end = datetime.now(UTC) + timedelta(minutes=1)
        self.requests += 1
        try:
            results = self._cloudwatch.get_metric_data(
                MetricDataQueries=[
                    {"Id": key, "ReturnData": True, "MetricStat": {
                        "Metric": {"Namespace": "AWS/SQS",
                                   "MetricName": "ApproximateAgeOfOldestMessage",
                                   "Dimensions": [{"Name": "QueueName",
                                                   "Value": _queue_name(urls[name])}]},
                        "Period": 60, "Stat": "Maximum"}}
                    for key, name in ids.items()
                ],
                StartTime=end - timedelta(minutes=11),
                EndTime=end,
                ScanBy="TimestampDescending",
            )["MetricDataResults"]  # fmt: skip
        except ClientError:
            return dict.fromkeys(urls)  # the other figures are still worth showing
        ages: dict[str, float | None] = dict.fromkeys(urls)
        for result in results:
            points = result.get("Values") or []
            if result.get("Id") in ids and points:
                ages[ids[result["Id"]]] = float(points[0])
        return ages

    def _events(self, detail_type: str, since_ms: int, until_ms: int) -> Iterable[dict[str, Any]]:
        # Only the fields counted: a page then holds thousands of events.
        names = {"#tenant": "tenant", "#worker": "workerId", "#at": "timestampMs",
                 "#p": "payload", "#tier": "priority", "#took": "duration_ms",
                 "#slots": "workerSlots"}  # fmt: skip
        return self._query(
            IndexName="byType",
            KeyConditionExpression="typePK = :pk AND typeSK BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(
                pk=keys.type_pk(self._settings.app_name, detail_type),
                lo=iso_ms(since_ms),
                hi=iso_ms(until_ms) + "~",
            ),
            ExpressionAttributeNames=names,
            ProjectionExpression="#tenant, #worker, #at, #p.#tier, #p.#took, #p.#slots",
        )

    def _live(self, state: TaskState) -> Iterable[dict[str, Any]]:
        names = {"#t": "tenant", "#o": "owner", "#h": "lastHeartbeatAt", "#u": "effectiveUntil",
                 "#c": "createdAt", "#e": "envelope", "#pr": "priority"}  # fmt: skip
        for shard in range(STATUS_SHARDS):
            yield from self._query(
                IndexName="byStatus",
                KeyConditionExpression="statusPK = :pk",
                ExpressionAttributeValues=values(pk=keys.status_partition(state.value, shard)),
                ExpressionAttributeNames=names,
                ProjectionExpression="#t, #o, #h, #u, #c, #e.#pr",
            )

    def _query(self, **query: Any) -> Iterable[dict[str, Any]]:
        if self._page_size is not None:
            query["Limit"] = self._page_size
        for _ in range(MAX_PAGES):
            self.requests += 1
            response = self._ddb.query(TableName=self._table, **query)
            yield from (from_item(item) for item in response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            query["ExclusiveStartKey"] = last
        self.truncated = True


def _distinct(urls: Mapping[str, str]) -> dict[str, str]:
    """Tiers by distinct queue, highest first (tiers sharing a queue are its highest)."""
    found: dict[str, str] = {}
    for tier, url in urls.items():
        if url not in found.values():
            found[tier] = url
    return found


def _queue_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _priority(record: Mapping[str, Any]) -> object:
    envelope = record.get("envelope")
    return envelope.get("priority") if isinstance(envelope, Mapping) else None


def _seen_worker(
    workers: dict[str, dict[str, Any]], event: Mapping[str, Any], payload: Mapping[str, Any]
) -> None:
    worker = event.get("workerId")
    if not isinstance(worker, str):
        return
    entry = workers.setdefault(worker, _worker(worker))
    slots, at = payload.get("workerSlots"), event.get("timestampMs")
    if isinstance(slots, int) and isinstance(at, int) and at >= entry["_slotsAt"]:
        entry["slots"], entry["_slotsAt"] = slots, at


def _busy_worker(workers: dict[str, dict[str, Any]], record: Mapping[str, Any], at: int) -> None:
    owner = record.get("owner")
    entry = workers.setdefault(str(owner or "?"), _worker(str(owner or "?")))
    entry["busy"] += 1
    beat = record.get("lastHeartbeatAt")
    if isinstance(beat, int) and (entry["lastHeartbeatMs"] or 0) < beat:
        entry["lastHeartbeatMs"] = beat
    until = record.get("effectiveUntil")
    if not isinstance(until, int) or until < at:
        entry["stale"] += 1


def _worker(name: str) -> dict[str, Any]:
    # Status "busy" until the roster says more: a worker that runs a task is live.
    return {"worker": name, "slots": None, "busy": 0, "lastHeartbeatMs": None, "stale": 0,
            "_slotsAt": -1, "status": "busy", "version": None, "lastSeenMs": None}  # fmt: skip


LIVE_STATUSES: Final = ("busy", "idle")
