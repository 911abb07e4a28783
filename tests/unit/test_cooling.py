"""Tiers the receiver leaves alone after a receive that was all sent back (worker.cooling)."""

from __future__ import annotations

import threading
import time
from typing import cast

import pytest
from support import wait_for

from agentq.config import Settings
from worker.batcher import SqsBatcher
from worker.cooling import TierCooling
from worker.inflight import InFlight
from worker.limited import LimitedTenants
from worker.seatwait import Wake

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cooling_tier_has_no_room_until_its_time_is_up() -> None:
    clock = Clock()
    cooling = TierCooling(clock=clock)
    cooling.cool("low", 2.0)
    assert cooling.open({"high": 3, "low": 3}) == {"high": 3, "low": 0}
    clock.now += 1.9
    assert cooling.open({"low": 3}) == {"low": 0}
    clock.now += 0.1
    assert cooling.open({"low": 3}) == {"low": 3}


def test_a_task_ending_here_warms_every_tier() -> None:
    cooling = TierCooling(clock=Clock())
    cooling.cool("low", 60.0)
    cooling.cool("normal", 60.0)
    cooling.warm()
    assert cooling.open({"low": 2, "normal": 1}) == {"low": 2, "normal": 1}


def test_wait_ends_at_a_warm_not_at_its_timeout() -> None:
    cooling = TierCooling()
    cooling.cool("low", 600.0)
    threading.Timer(0.2, cooling.warm).start()
    began = time.monotonic()
    cooling.wait(timeout_s=60.0)
    assert time.monotonic() - began < 60.0
    assert cooling.open({"low": 1}) == {"low": 1}


def test_wait_returns_at_once_with_nothing_cooling() -> None:
    cooling = TierCooling()
    began = time.monotonic()
    cooling.wait(timeout_s=60.0)
    assert time.monotonic() - began < 60.0


def test_remaining_rounds_up_to_the_first_tier_to_open() -> None:
    clock = Clock()
    cooling = TierCooling(clock=clock)
    assert cooling.remaining_s() is None
    cooling.cool("low", 1.2)
    cooling.cool("normal", 5.0)
    assert cooling.remaining_s() == 2
    clock.now += 1.2
    assert cooling.remaining_s() == 4  # low is open again: normal's 3.8 s
    clock.now += 3.8
    assert cooling.remaining_s() is None


def test_only_the_end_of_a_parked_tenants_task_warms_the_tiers() -> None:
    settings = Settings.from_env({"MAX_CONCURRENT": "4", "TENANT_LIMIT_BACKOFF_MS": "600000",
                                  "TENANT_LIMIT_PARK_MS": "600000"})  # fmt: skip
    limited = LimitedTenants(settings, cast(SqsBatcher, None), waits_for_seat=lambda _: True)
    try:
        limited.cool("low")
        parked = limited.lock(lambda *_: limited.seats.park("flood", time.monotonic()),
                              {}, cast(InFlight, None))  # fmt: skip
        wait_for(lambda: limited.seats.parked == 1, timeout=10, message="one parked")
        # Another tenant's task ended: the flood is still at its limit, the tier stays cool.
        limited.task_ended("other", 0)
        assert limited.cooling.open({"low": 2}) == {"low": 0}
        # The flood's own task ended: its parked message takes the seat, and there is
        # room to park the next one.
        limited.task_ended("flood", 1)
        assert parked.result(timeout=10) == Wake(freed_here=True, seat=1)
        assert limited.cooling.open({"low": 2}) == {"low": 2}
    finally:
        limited.close()
        limited.shutdown()
