"""The receiver's side of priority tiers: ask the scheduler, receive, tell it what came.

`TierReceiver` owns the tier queues' URLs and the scheduler (worker/scheduler.py, pure
policy). Each receive goes to the tier the scheduler picks, for as many messages as that
tier may bring (the intake's per-tier rooms). Backlog figures come from what receives
return; `GetQueueAttributes` is asked at most every `SCHEDULER_BACKLOG_REFRESH` (one
call per tier), never per receive. Tiers that share a queue URL are one tier (a
single-queue deployment has exactly one, and receives as it always did).

Every tier above the lowest is *watched*: `watch(tier, ...)` keeps one long poll of its
own outstanding (the consumer runs it on a thread per such tier), for the places that
tier has reserved in the prefetch, so a high-priority message is in hand the moment it
arrives and takes the next slot that frees. The scheduler never probes a watched tier,
and a backlog refresh asks only tiers whose figures no receive renewed within its
interval (the watched ones never), so a flood costs almost no `GetQueueAttributes`.

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
from agentq.envelope import PRIORITY_PATTERN, DecodedBody
from agentq.errors import InvalidInput
from agentq.json_text import decode_json
from worker.receive.placement import MAX_RECEIVE
from worker.routes import tier_urls
from worker.scheduler import Pick, Scheduler

logger = logging.getLogger(__name__)


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
            watched=frozenset(self.tiers[:-1]),
        )
        self._refreshed_at: float | None = None
        # The tier whose starvation turn is being received (weighted mode), until the
        # consumer has handed its messages to the intake: the watchers wait for it.
        self._turn: str | None = None
        self._lock = threading.Lock()
        # The scheduler is pure and single-threaded; the receiver and the watchers share it.
        self._scheduling = threading.Lock()
        self.counts: dict[str, int] = {
            "receives": 0, "emptyReceives": 0, "watchReceives": 0, "backlogRefreshes": 0,
            "attributeCalls": 0, "forwarded": 0,
        }  # fmt: skip
        self.picks: dict[str, int] = dict.fromkeys(self.tiers, 0)

    @property
    def multi(self) -> bool:
        return len(self.tiers) > 1

    @property
    def watched(self) -> tuple[str, ...]:
        """The tiers with a long poll of their own (highest first)."""
        return tuple(t for t in self.tiers if t in self.scheduler.watched)

    def receive(self, rooms: Mapping[str, int]) -> tuple[Pick | None, list[dict[str, Any]]]:
        """One receive from the tier the scheduler picks; (None, []) if none has room.

        After a pick that is a starvation turn (`Pick.overdue`) the watchers wait until
        the caller has placed what it brought and called `turn_taken`."""
        self._refresh_if_due()
        with self._scheduling:
            pick: Pick | None = self.scheduler.pick(self._clock(), rooms)
            if pick is not None and pick.overdue:
                self._turn = pick.tier
        if pick is None:
            return None, []
        try:
            messages = self._receive(pick.tier, self._asked(pick, rooms), pick.wait_s)
        except Exception:
            self.turn_taken()
            raise
        with self._lock:
            self.picks[pick.tier] += 1
            # The scheduler's misses (probes of drained tiers, idle polls); a watcher's
            # long poll that times out is its idle cost, counted in watchReceives.
            self.counts["emptyReceives"] += not messages
        return pick, messages

    def _asked(self, pick: Pick, rooms: Mapping[str, int]) -> int:
        """A starvation turn brings up to one message per slot, not its tier's prefetch
        room (one or two places under higher-tier work): the tier's share while higher
        work fills the fleet is then a slot's worth per worker per bound, and a task of
        it that arrives at that pace or slower starts within the bound plus one hand-over
        (bench/priority.py, the starving runs). Its messages take the next slots that
        free, so the higher tiers wait one hand-over per turn."""
        if pick.overdue:
            return max(rooms[pick.tier], min(MAX_RECEIVE, self._settings.max_concurrent))
        return rooms[pick.tier]

    def turn_taken(self) -> None:
        """The starvation turn's messages are in the intake: the watchers may go on."""
        with self._scheduling:
            self._turn = None

    def may_watch(self, tier: str) -> bool:
        """False while another tier is past the starvation bound or is receiving its
        turn (weighted mode): the watcher pauses so that tier's message is the next to
        take a slot (worker/scheduler.py, `overdue`)."""
        with self._scheduling:
            if self._turn not in (None, tier):
                return False
            return all(t == tier for t in self.scheduler.overdue(self._clock()))

    def watch(self, tier: str, asked: int) -> list[dict[str, Any]]:
        """The long poll a watched tier keeps outstanding, for `asked` messages."""
        # Never a short poll: with WAIT_TIME_SECONDS=0 a watcher would spin on empty receives.
        messages = self._receive(tier, asked, max(1, self._settings.wait_time_seconds))
        with self._lock:
            self.counts["watchReceives"] += 1
        return messages

    def _receive(self, tier: str, asked: int, wait_s: int) -> list[dict[str, Any]]:
        response = self._sqs.receive_message(
            QueueUrl=self.urls[tier],
            MaxNumberOfMessages=asked,
            WaitTimeSeconds=wait_s,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=[
                "ApproximateReceiveCount",
                "SentTimestamp",
                "MessageGroupId",
            ],
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        with self._scheduling:
            self.scheduler.received(tier, asked=asked, got=len(messages), now=self._clock())
        with self._lock:
            self.counts["receives"] += 1
        return messages

    def _refresh_if_due(self) -> None:
        """Ask the backlog of the tiers whose figures went stale (none while receives or
        watchers keep them fresh), at most every SCHEDULER_BACKLOG_REFRESH."""
        interval = self._settings.backlog_refresh_ms / 1000
        now = self._clock()
        if not self.multi or interval <= 0:
            return
        if self._refreshed_at is not None and now - self._refreshed_at < interval:
            return
        self._refreshed_at = now
        with self._scheduling:
            stale = self.scheduler.stale(now, interval)
        if not stale:
            return
        backlog: dict[str, int] = {}
        for tier in stale:
            with self._lock:
                self.counts["attributeCalls"] += 1
            try:
                url = self.urls[tier]
                attributes = self._sqs.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
                backlog[tier] = int(attributes.get("ApproximateNumberOfMessages", 0))
            except Exception:
                # Throttled or failed: the estimate from receives stands until next time.
                logger.warning("backlog refresh failed", extra={"tier": tier}, exc_info=True)
        with self._lock:
            self.counts["backlogRefreshes"] += 1
        with self._scheduling:
            self.scheduler.refreshed(backlog, now=self._clock())

    def destination(self, message: dict[str, Any], tier: str) -> str | None:
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


def _priority_of(message: dict[str, Any]) -> str | None:
    attribute = (message.get("MessageAttributes") or {}).get("priority")
    value: object = attribute.get("StringValue") if isinstance(attribute, Mapping) else None
    if value is None:
        text = message.get("Body") or ""
        try:
            # The shared untrusted-JSON reader: a 10,000-deep body is refused, not a
            # RecursionError that would leave the message unsettled.
            body = text.data if isinstance(text, DecodedBody) else decode_json(text)
        except (InvalidInput, TypeError):
            return None
        # Handed on decoded: the envelope parser reads this value, not the text again.
        message["Body"] = DecodedBody(text, body)
        if isinstance(body, dict) and isinstance(body.get("detail"), dict):
            body = body["detail"]
        value = body.get("priority") if isinstance(body, dict) else None
    if isinstance(value, str) and PRIORITY_PATTERN.fullmatch(value):
        return value
    return None
