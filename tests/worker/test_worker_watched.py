"""A watched tier's arrivals are its watcher's: the receive loop never long-polls beside it.

Timing every step of the tenant-limit benchmark's slow B and C tasks showed them caught
by the *receive loop* of a worker whose slots were all busy (its long poll asks for the
prefetch too) while the other worker's watcher, with free slots, waited for the same
message; it then waited there for a hand-over. That loop long-polled a watched tier when
the lowest tier cooled (a limited tenant parked full) and after any watcher's full batch.
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
from support import wait_for
from worker_support import send

from agentq.config import Settings
from worker.cooling import TierCooling
from worker.intake import Intake
from worker.receiving import PassOn, Receiving
from worker.tiers import TierReceiver


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


class CountedCooling(TierCooling):
    """The real cooling, counting the receive loop's waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.receiver_waits = 0

    def wait(self, timeout_s: float) -> None:
        if threading.current_thread().name == "receiver":
            self.receiver_waits += 1
        super().wait(timeout_s)


@pytest.mark.timeout(60)
def test_while_the_lowest_tier_cools_only_the_watchers_poll_the_watched_tiers(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAIT_TIME_SECONDS", "1")  # the watchers' polls end soon after the stop
    settings = Settings.from_env()
    tiers = TierReceiver(settings, sqs=stack.sqs)
    tiers.scheduler.refreshed(dict.fromkeys(tiers.tiers, 0), now=time.monotonic())
    cooling = CountedCooling()
    cooling.cool("low", 600.0)  # a limited tenant's flood, parked full here
    accepted: list[tuple[str, str]] = []

    def accept(message: dict[str, Any], tier: str, starving: bool, pass_on: PassOn) -> bool:
        accepted.append((tier, threading.current_thread().name))
        return False  # placed, not sent straight back

    stopping = threading.Event()
    receiving = Receiving(
        slots=Intake(settings.max_concurrent, horizon_s=0.0), tiers=tiers, cooling=cooling,
        cool=lambda tier: None, note_route=lambda handle, url: None,
        accept=accept, stopping=stopping,
    )  # fmt: skip
    with receives_sent(stack, tiers) as polls:
        receiving.start()
        try:
            send(stack, "sample-echo", {"text": "urgent"}, priority="high")
            wait_for(lambda: accepted, timeout=20, message="the high task received")
            assert accepted == [("high", "watch-high")], "a watcher's, for a free slot"
            wait_for(lambda: cooling.receiver_waits >= 5, timeout=20,
                     message="the receive loop waiting on the cooled tier")  # fmt: skip
            assert not [p for p in polls if p[0] == "receiver"], (
                "nothing to pick while only watched tiers are open and believed empty"
            )
            cooling.warm()  # a task of the parked tenant ended: the lowest tier opens
            wait_for(lambda: ("receiver", "low") in {(p[0], p[1]) for p in polls}, timeout=20,
                     message="the receive loop back on the lowest tier")  # fmt: skip
            assert all(p[1] == "low" for p in polls if p[0] == "receiver")
        finally:
            stopping.set()
            receiving.join(by=time.monotonic() + 10)


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
