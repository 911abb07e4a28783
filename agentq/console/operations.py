"""Queues and workers: depth, in flight, oldest waiting task, busy workers, rates.

Nothing here receives from a queue: a receive, even with visibility 0, counts toward
the message's `maxReceiveCount` and could dead-letter it. Depths come from queue
attributes, the oldest waiting task from the status index (its first PENDING entry),
workers from the roster (agentq.store.workers) and the PROCESSING tasks' STATE items
(owner and last lease heartbeat), and
rates from the byType event index over the last few minutes, and each queue's oldest
message age from SQS's CloudWatch metric. A refresh costs a fixed number of requests:
a queue read and a metric read per tier queue and the DLQ, 4 + 4 + 4 status-index
queries, 4 event queries and one roster query.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.client import AgentqClient
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store.workers import WorkerEntry, WorkerRoster

RATE_MINUTES: Final = 5
RATE_TYPES: Final = ("Task Processing Started", "Task Completed", "Task Failed", "Task Timeout")
_MINUTE_MS: Final = 60_000


class Operations:
    def __init__(self, client: AgentqClient, sqs: Any, cloudwatch: Any = None) -> None:
        self._client = client
        self._sqs = sqs
        self._cloudwatch = cloudwatch

    def snapshot(self) -> dict[str, Any]:
        settings = self._client.settings
        now = now_ms()
        # One row per tier queue (tiers sharing a queue share its row), then the DLQ.
        by_url: dict[str, list[str]] = {}
        tiers_urls = settings.tier_queue_urls() or {"tasks": settings.required("queue_url")}
        for tier, url in tiers_urls.items():
            by_url.setdefault(url, []).append(tier)
        queues = [self._queue(" + ".join(tiers), url) for url, tiers in by_url.items()]
        if settings.dlq_url:
            queues.append(self._queue("dead letters", settings.dlq_url))
        tasks = self._client.tasks
        oldest = {}
        for state in (TaskState.PENDING, TaskState.RETRYING):
            first = tasks.tasks_by_status(state, limit=1)
            oldest[state.value] = (now - (first[0].created_at_ms or now)) if first else None
        processing = tasks.tasks_by_status(TaskState.PROCESSING)
        return {
            "at": now,
            "queues": queues,
            "oldestWaitingMs": oldest,
            "workers": _workers(processing, self._roster(), now),
            "rates": self._rates(now),
        }

    def _queue(self, name: str, url: str | None) -> dict[str, Any]:
        if not url:
            return {"name": name, "url": None}
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return {
            "name": name,
            "url": url,
            "depth": int(attributes.get("ApproximateNumberOfMessages", 0)),
            "inFlight": int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
            "delayed": int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
            "oldestAgeS": self._oldest_age_s(url),
        }

    def _oldest_age_s(self, url: str) -> float | None:
        """SQS's own metric of the oldest message's age (None where there is none yet,
        as on moto): reading it receives nothing, unlike a peek."""
        if self._cloudwatch is None:
            return None
        # The end a minute ahead: the current minute's datapoint is the one wanted.
        end = datetime.now(UTC) + timedelta(minutes=1)
        try:
            points = self._cloudwatch.get_metric_statistics(
                Namespace="AWS/SQS",
                MetricName="ApproximateAgeOfOldestMessage",
                Dimensions=[{"Name": "QueueName", "Value": url.rstrip("/").rsplit("/", 1)[-1]}],
                StartTime=end - timedelta(minutes=11),
                EndTime=end,
                Period=60,
                Statistics=["Maximum"],
            ).get("Datapoints", [])
        except ClientError:
            return None  # a page of queues is still worth showing without this figure
        latest = max(points, key=lambda p: p["Timestamp"]) if points else None
        return float(latest["Maximum"]) if latest else None

    def _roster(self) -> list[WorkerEntry]:
        try:
            return WorkerRoster(self._client.dynamodb, self._client.settings.required(
                "table_name")).entries()  # fmt: skip
        except ClientError:
            return []  # without read access to it, the workers the tasks name remain

    def _rates(self, now: int) -> list[dict[str, Any]]:
        # Whole clock minutes, the last one still filling.
        since = (now // _MINUTE_MS - (RATE_MINUTES - 1)) * _MINUTE_MS
        minutes = [{"minuteMs": since + i * _MINUTE_MS} | dict.fromkeys(RATE_TYPES, 0)
                   for i in range(RATE_MINUTES)]  # fmt: skip
        for kind in RATE_TYPES:
            for event in self._client.event_store.events_by_type(kind, since_ms=since):
                at = event.get("timestampMs")
                if isinstance(at, int) and since <= at <= now:
                    minutes[(at - since) // _MINUTE_MS][kind] += 1
        return minutes


def _workers(processing: list[Any], roster: list[WorkerEntry], now: int) -> list[dict[str, Any]]:
    """Every worker of the roster (busy, idle, gone; a cleanly stopped one only while it
    still names a task) with its slots, version and last announcement, and the tasks the
    PROCESSING items say it runs."""
    workers: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        return workers.setdefault(name, {"worker": name, "busy": 0, "tasks": [],
                                         "lastHeartbeatMs": None, "stale": 0, "slots": None,
                                         "version": None, "lastSeenMs": None,
                                         "status": "busy"})  # fmt: skip

    for entry in roster:
        status = entry.status(now)
        if status != "stopped":
            row(entry.worker).update(slots=entry.slots, version=entry.version,
                                     lastSeenMs=entry.seen_ms, status=status)  # fmt: skip
    for record in processing:
        worker = row(record.owner or "?")
        if worker["status"] == "idle":
            worker["status"] = "busy"  # the roster is up to half a minute behind
        worker["busy"] += 1
        worker["tasks"].append({"requestId": record.request_id, "tenant": record.tenant})
        beat = record.raw.get("lastHeartbeatAt")
        if isinstance(beat, int) and (worker["lastHeartbeatMs"] or 0) < beat:
            worker["lastHeartbeatMs"] = beat
        if not record.lease_live(now):
            worker["stale"] += 1
    return sorted(workers.values(), key=lambda w: str(w["worker"]))
