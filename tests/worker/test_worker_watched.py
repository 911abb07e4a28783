"""A watched tier's arrivals are its watcher's: the receive loop never long-polls beside it.

Timing every step of the tenant-limit benchmark's slow B and C tasks showed them caught
by the *receive loop* of a worker whose slots were all busy (its long poll asks for the
prefetch too) while the other worker's watcher, with free slots, waited for the same
message; it then waited there for a hand-over. That loop long-polled a watched tier after
any watcher's full batch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import Stack
from worker_support import send

from agentq.config import Settings
from worker.receive.tiers import TierReceiver


@contextmanager
def receives_sent(stack: Stack, tiers: TierReceiver) -> Iterator[list[tuple[str, str, int]]]:
    """Every ReceiveMessage the client sends, as (thread, tier, WaitTimeSeconds)."""
    sent: list[tuple[str, str, int]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        tier = next(t for t, url in tiers.urls.items() if url == params["QueueUrl"])
        sent.append((threading.current_thread().name, tier, params["WaitTimeSeconds"]))

    stack.sqs.meta.events.register("provide-client-params.sqs.ReceiveMessage", record)
    try:
        yield sent
    finally:
        stack.sqs.meta.events.unregister("provide-client-params.sqs.ReceiveMessage", record)


@pytest.mark.timeout(60)
def test_a_known_watched_backlog_is_taken_with_a_short_poll_and_then_left_alone(
    stack: Stack,
) -> None:
    """After a watcher's full batch the estimate says more may wait: the receive loop
    takes what does, without waiting for arrivals, and an empty answer ends the belief."""
    settings = Settings.from_env()
    tiers = TierReceiver(settings, sqs=stack.sqs)
    tiers.scheduler.refreshed(dict.fromkeys(tiers.tiers, 0), now=time.monotonic())
    waiting = send(stack, "sample-echo", {"text": "queued"}, priority="high")
    tiers.scheduler.received("high", asked=1, got=1, now=time.monotonic())  # a full batch
    rooms = {"high": 2, "normal": 2, "low": 0}
    with receives_sent(stack, tiers) as polls:
        pick, messages = tiers.receive(rooms)
        assert pick is not None and pick.tier == "high"
        assert [json.loads(m["Body"])["requestId"] for m in messages] == [waiting.request_id]
        assert [wait for *_, wait in polls] == [0], (
            "a short poll: what waits, never an arrival for another worker"
        )
        assert tiers.receive(rooms) == (None, []), "drained: left to the watcher"
        assert len(polls) == 1
