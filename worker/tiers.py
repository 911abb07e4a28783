"""The receiver's side of priority tiers: ask the scheduler, receive, tell it what came.

`TierReceiver` owns the tier queues' URLs and the scheduler (worker/scheduler.py, pure
policy). Each receive goes to the tier the scheduler picks, for as many messages as that
tier may bring (the intake's per-tier rooms). Backlog figures come from what receives
return; `GetQueueAttributes` is asked at most every `SCHEDULER_BACKLOG_REFRESH` (one
call per tier), never per receive. Tiers that share a queue URL are one tier (a
single-queue deployment has exactly one, and receives as it always did).

A message whose own priority names another tier (a `Task Requested` event, which the
bus delivers to the default tier's queue, or a foreign sender that used the wrong
queue) is *forwarded*: sent to its tier's queue and deleted here, before anything else
happens to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentq.config import Settings
from agentq.envelope import PRIORITY_PATTERN, decode_json
from agentq.errors import InvalidInput
from worker.scheduler import Pick, Scheduler

logger = logging.getLogger(__name__)


def tier_urls(settings: Settings) -> dict[str, str]:
    """Distinct queues by tier, highest first; tiers sharing a URL keep the highest."""
    urls: dict[str, str] = {}
    for tier, url in settings.tier_queue_urls().items():
        if url not in urls.values():
            urls[tier] = url
    return urls


class TierReceiver:
    def __init__(
        self,
        settings: Settings,
        sqs: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._sqs = sqs
        self._clock = clock
        self.urls = tier_urls(settings)
        if not self.urls:
            self.urls = {settings.default_priority: settings.required("queue_url")}
        self.tiers = tuple(self.urls)
        self.ranks = {tier: rank for rank, tier in enumerate(self.tiers)}
        self.scheduler = Scheduler(
            tiers=self.tiers,
            mode=settings.scheduler_mode,
            starvation_s=settings.starvation_bound_ms / 1000,
            probe_s=settings.probe_interval_ms / 1000,
            idle_wait_s=settings.wait_time_seconds,
            weights=settings.tier_weights(),
            started=clock(),
        )
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {"receives": 0, "backlogRefreshes": 0, "forwarded": 0}
        self.picks: dict[str, int] = dict.fromkeys(self.tiers, 0)

    @property
    def multi(self) -> bool:
        return len(self.tiers) > 1

    def receive(self, rooms: Mapping[str, int]) -> tuple[str, list[dict[str, Any]]]:
        """One receive from the tier the scheduler picks; ("", []) if none has room."""
        self._refresh_if_due()
        now = self._clock()
        pick: Pick | None = self.scheduler.pick(now, rooms)
        if pick is None:
            return "", []
        asked = rooms[pick.tier]
        response = self._sqs.receive_message(
            QueueUrl=self.urls[pick.tier],
            MaxNumberOfMessages=asked,
            WaitTimeSeconds=pick.wait_s,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=[
                "ApproximateReceiveCount",
                "SentTimestamp",
                "MessageGroupId",
            ],
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        self.scheduler.received(pick.tier, asked=asked, got=len(messages), now=self._clock())
        with self._lock:
            self.counts["receives"] += 1
            self.picks[pick.tier] += 1
        return pick.tier, messages

    def _refresh_if_due(self) -> None:
        interval = self._settings.backlog_refresh_ms / 1000
        now = self._clock()
        if not self.multi or interval <= 0:
            return
        if self._refreshed_at is not None and now - self._refreshed_at < interval:
            return
        self._refreshed_at = now
        backlog: dict[str, int] = {}
        for tier, url in self.urls.items():
            try:
                attributes = self._sqs.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
                backlog[tier] = int(attributes.get("ApproximateNumberOfMessages", 0))
            except Exception:
                # Throttled or failed: the estimate from receives stands until next time.
                logger.warning("backlog refresh failed", extra={"tier": tier}, exc_info=True)
        with self._lock:
            self.counts["backlogRefreshes"] += 1
        self.scheduler.refreshed(backlog, now=self._clock())

    def destination(self, message: Mapping[str, Any], tier: str) -> str | None:
        """The queue a message received from `tier` belongs on, if that is another one.

        The priority is untrusted input: anything but a configured tier with its own
        queue leaves the message where it is (validation judges it there)."""
        if not self.multi:
            return None
        priority = _priority_of(message)
        if priority is None or priority == tier or priority not in self.urls:
            return None
        url = self.urls[priority]
        if url == self.urls[tier]:
            return None
        with self._lock:
            self.counts["forwarded"] += 1
        return url

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self.counts, "picks": dict(self.picks), "mode": self.scheduler.mode}


def _priority_of(message: Mapping[str, Any]) -> str | None:
    attribute = (message.get("MessageAttributes") or {}).get("priority")
    value: object = attribute.get("StringValue") if isinstance(attribute, Mapping) else None
    if value is None:
        try:
            # The shared untrusted-JSON reader: a 10,000-deep body is refused, not a
            # RecursionError that would leave the message unsettled.
            body = decode_json(message.get("Body") or "")
        except (InvalidInput, TypeError):
            return None
        if isinstance(body, dict) and isinstance(body.get("detail"), dict):
            body = body["detail"]
        value = body.get("priority") if isinstance(body, dict) else None
    if isinstance(value, str) and PRIORITY_PATTERN.fullmatch(value):
        return value
    return None
