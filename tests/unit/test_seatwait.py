"""Parked messages waiting for a seat of their tenant (worker.parking), with real threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from support import wait_for

from worker.parking import SeatWaits, Wake

pytestmark = pytest.mark.timeout(60)

# Long enough that no parked message in these tests wakes by its own timer.
NEVER = 600.0


def _park(pool: ThreadPoolExecutor, seats: SeatWaits, tenant: str) -> Future[Wake | None]:
    return pool.submit(seats.park, tenant, time.monotonic())


def test_a_freed_seat_wakes_one_parked_message_of_its_tenant_only() -> None:
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(4) as pool:
        crowd = [_park(pool, seats, "crowd") for _ in range(2)]
        other = _park(pool, seats, "other")
        wait_for(lambda: seats.parked == 3, timeout=10, message="three parked")
        assert seats.freed("crowd", 1) is True
        wait_for(lambda: sum(f.done() for f in crowd) == 1, timeout=10,
                 message="one crowd message woke")  # fmt: skip
        # Woken for the seat freed here, which it is told to take.
        assert [f.result() for f in crowd if f.done()] == [Wake(freed_here=True, seat=1)]
        assert seats.parked == 2 and not other.done()
        assert seats.freed("nobody") is False  # none of that tenant parked: nothing wakes
        seats.close()
        assert [f.result(timeout=10) for f in crowd if not f.done()] == [None]
        assert other.result(timeout=10) is None


def test_a_seat_freed_with_nobody_parked_is_not_kept_for_later() -> None:
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=0.3)
    assert seats.freed("crowd") is False
    started = time.monotonic()
    # Woken only by the end of its park time (a last try), never by the stale seat.
    assert seats.park("crowd", started) == Wake(freed_here=False)
    assert time.monotonic() - started >= 0.3
    assert seats.park("crowd", started) is None, "its park time is over"


def test_a_parked_message_tries_again_after_the_back_off() -> None:
    seats = SeatWaits(slots=8, retry_s=0.2, park_s=NEVER)
    started = time.monotonic()
    # Not freed here: a seat may have freed on another worker, which it must look for.
    assert seats.park("crowd", started) == Wake(freed_here=False, seat=None)
    # Jittered from half the back-off to all of it.
    assert 0.1 <= time.monotonic() - started < NEVER


def test_parking_is_bounded_per_tenant_and_per_worker() -> None:
    seats = SeatWaits(slots=4, retry_s=NEVER, park_s=NEVER)  # 2 a tenant, 4 in all
    with ThreadPoolExecutor(4) as pool:
        crowd = [_park(pool, seats, "crowd") for _ in range(2)]
        wait_for(lambda: seats.parked == 2, timeout=10, message="two parked")
        assert seats.full("crowd") and not seats.full("other")
        assert not seats.room("crowd") and seats.room("other")
        assert seats.park("crowd", time.monotonic()) is None, "a third of one tenant"
        others = [_park(pool, seats, tenant) for tenant in ("b", "c")]
        wait_for(lambda: seats.parked == 4, timeout=10, message="four parked")
        assert seats.park("d", time.monotonic()) is None, "a fifth in all"
        seats.close()
        assert [f.result(timeout=10) for f in crowd + others] == [None] * 4
    assert seats.parked == 0 and not seats.full("crowd")


def test_no_parking_when_park_time_is_zero_or_closed() -> None:
    assert SeatWaits(slots=4, retry_s=1.0, park_s=0).park("crowd", time.monotonic()) is None
    closed = SeatWaits(slots=4, retry_s=NEVER, park_s=NEVER)
    assert closed.room("crowd")
    closed.close()
    assert not closed.room("crowd")
    assert closed.park("crowd", time.monotonic()) is None


def test_close_wakes_every_parked_message_at_once() -> None:
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=NEVER)
    results: list[Wake | None] = []
    threads = [
        threading.Thread(target=lambda t=t: results.append(seats.park(t, time.monotonic())))
        for t in ("a", "b", "c")
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: seats.parked == 3, timeout=10, message="three parked")
    seats.close()
    for thread in threads:
        thread.join(timeout=10)
    assert results == [None, None, None]


def test_a_refusal_marks_its_tenant_at_its_limit_for_the_back_off_only() -> None:
    now = [100.0]
    seats = SeatWaits(slots=8, retry_s=2.0, park_s=NEVER, clock=lambda: now[0])
    assert not seats.refused_lately("crowd")
    seats.refused("crowd")
    assert seats.refused_lately("crowd") and not seats.refused_lately("other")
    now[0] += 1.9
    assert seats.refused_lately("crowd")
    now[0] += 0.2  # the back-off has passed: its next message tries the lock again
    assert not seats.refused_lately("crowd")
    seats.refused("crowd")
    now[0] += 1.5
    seats.refused("crowd")  # each refusal starts the back-off again
    now[0] += 1.5
    assert seats.refused_lately("crowd")


def test_each_parked_message_woken_here_is_told_a_different_freed_seat() -> None:
    seats = SeatWaits(slots=8, retry_s=NEVER, park_s=NEVER)
    with ThreadPoolExecutor(4) as pool:
        crowd = [_park(pool, seats, "crowd") for _ in range(3)]
        wait_for(lambda: seats.parked == 3, timeout=10, message="three parked")
        seats.freed("crowd", 0)
        seats.freed("crowd", 2)
        wait_for(lambda: sum(f.done() for f in crowd) == 2, timeout=10, message="two woke")
        woken = [f.result() for f in crowd if f.done()]
        assert len(woken) == 2 and {w.seat for w in woken if w is not None} == {0, 2}
        # A seat freed by a task that held none (its index unknown) still wakes one.
        seats.freed("crowd")
        wait_for(lambda: all(f.done() for f in crowd), timeout=10, message="the third woke")
        assert Wake(freed_here=True, seat=None) in [f.result() for f in crowd]
