"""BatchLoop, the flush loop under the worker's SQS and event batchers, on its own.

A tiny subclass records each batch `_send` receives, on which thread, and when; it can
be told to fail a batch or to hold a send open so a batch is in flight. No AWS here:
the batchers' own tests (tests/worker) cover what they put on the wire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from support import wait_for

from worker.sqs.batchloop import BatchLoop, run_after

pytestmark = pytest.mark.timeout(60)

# Generous against a shared, loaded machine; passing tests never wait this long.
BOUND_S = 10.0


class Recorder(BatchLoop[int]):
    def __init__(self, *, delay_s: float, max_batch: int) -> None:
        # Set before the base class starts the loop thread, which reads them.
        self.sent: list[list[int]] = []
        self.failed: list[list[int]] = []
        self.send_threads: list[threading.Thread] = []
        self.send_times: list[float] = []
        self.fail_when: Callable[[list[int]], bool] = lambda batch: False
        self.started = threading.Event()  # a send has begun
        self.release = threading.Event()  # cleared: sends block until set
        self.release.set()
        super().__init__(name="test-batchloop", delay_s=delay_s, max_batch=max_batch)

    def add(self, *entries: int) -> None:
        self._submit(list(entries))

    def sent_entries(self) -> list[int]:
        return [entry for batch in self.sent for entry in batch]

    def _send(self, batch: list[int]) -> None:
        self.send_threads.append(threading.current_thread())
        self.send_times.append(time.monotonic())
        self.started.set()
        if not self.release.wait(BOUND_S):
            raise TimeoutError("the test never released the send")
        if self.fail_when(batch):
            raise RuntimeError(f"send failed for {batch}")
        # Recorded last, so "flush() returned True" must already show the batch here.
        self.sent.append(list(batch))

    def _failed(self, batch: list[int]) -> None:
        self.failed.append(list(batch))
        super()._failed(batch)


MakeLoop = Callable[..., Recorder]


@pytest.fixture
def make_loop() -> Iterator[MakeLoop]:
    loops: list[Recorder] = []

    def make(*, delay_s: float = 0.02, max_batch: int = 10) -> Recorder:
        loop = Recorder(delay_s=delay_s, max_batch=max_batch)
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.release.set()
        loop.close(timeout_s=1.0)


def test_entries_handed_over_within_the_window_go_out_together(make_loop: MakeLoop) -> None:
    delay_s = 0.5
    loop = make_loop(delay_s=delay_s)
    handed_over = time.monotonic()
    loop.add(1)
    loop.add(2)
    loop.add(3, 4)

    wait_for(lambda: loop.sent, timeout=BOUND_S, message="the batch")
    assert loop.sent == [[1, 2, 3, 4]]
    # The loop waited out the window for companions instead of sending the first alone.
    assert loop.send_times[0] - handed_over >= delay_s - 0.01


def test_a_full_batch_goes_out_without_waiting_for_the_window(make_loop: MakeLoop) -> None:
    # A 30 s window: anything that waits for it fails the bounded wait below.
    loop = make_loop(delay_s=30.0, max_batch=3)
    loop.add(1)
    loop.add(2)
    loop.add(3)
    wait_for(lambda: len(loop.sent) == 1, timeout=BOUND_S, message="the first full batch")

    loop.add(4, 5, 6, 7, 8, 9)
    wait_for(lambda: len(loop.sent) == 3, timeout=BOUND_S, message="two more full batches")
    assert loop.sent == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_order_is_kept_across_batches_of_at_most_max_batch(make_loop: MakeLoop) -> None:
    loop = make_loop(delay_s=0.02, max_batch=4)
    expected: list[int] = []
    for size in (1, 5, 3, 9, 2, 4):
        chunk = list(range(len(expected), len(expected) + size))
        loop.add(*chunk)
        expected += chunk

    assert loop.flush(BOUND_S)
    assert loop.sent_entries() == expected
    assert all(1 <= len(batch) <= 4 for batch in loop.sent), loop.sent


def test_flush_waits_for_the_batch_in_flight_and_what_came_after(make_loop: MakeLoop) -> None:
    loop = make_loop(delay_s=0.0)
    loop.release.clear()
    loop.add(1)
    assert loop.started.wait(BOUND_S), "the first batch never started"

    # Nothing is pending any more, yet [1] is not sent: flush must not claim it is.
    assert loop.flush(timeout_s=0.2) is False
    assert loop.sent == []

    loop.add(2)  # handed over while batch [1] is in flight
    assert loop.flush(timeout_s=0.2) is False
    loop.release.set()
    assert loop.flush(BOUND_S) is True
    assert loop.sent == [[1], [2]]


def test_flush_with_nothing_handed_over_returns_at_once(make_loop: MakeLoop) -> None:
    loop = make_loop(delay_s=30.0)
    started = time.monotonic()
    assert loop.flush(BOUND_S) is True
    assert time.monotonic() - started < BOUND_S


def test_a_failed_send_is_handed_to_failed_and_the_loop_goes_on(
    make_loop: MakeLoop, caplog: pytest.LogCaptureFixture
) -> None:
    loop = make_loop(delay_s=0.0)
    loop.fail_when = lambda batch: 13 in batch
    with caplog.at_level(logging.ERROR, logger="worker.sqs.batchloop"):
        loop.add(13)
        # A failed batch is settled too: flush does not hang on it.
        assert loop.flush(BOUND_S)
    assert loop.failed == [[13]]
    assert loop.sent == []
    [record] = [r for r in caplog.records if r.name == "worker.sqs.batchloop"]
    assert record.getMessage() == "batch failed"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError

    loop.add(14)
    loop.add(15)
    assert loop.flush(BOUND_S)
    assert loop.sent_entries() == [14, 15]
    assert loop.failed == [[13]]


def test_close_drains_pending_stops_the_thread_then_sends_inline(make_loop: MakeLoop) -> None:
    loop = make_loop(delay_s=0.3)
    loop.add(1, 2, 3)
    loop.add(4)
    loop.close(timeout_s=BOUND_S)

    assert loop.sent_entries() == [1, 2, 3, 4]
    loop_thread = loop.send_threads[0]
    assert loop_thread is not threading.current_thread()
    assert loop_thread.name == "test-batchloop"
    assert not loop_thread.is_alive()

    # After close nothing may be lost: the entry is sent before add() returns, right here.
    loop.add(5)
    assert loop.sent[-1] == [5]
    assert loop.send_threads[-1] is threading.current_thread()


def test_close_is_bounded_while_a_send_hangs(make_loop: MakeLoop) -> None:
    loop = make_loop(delay_s=0.0)
    loop.release.clear()
    loop.add(1)
    assert loop.started.wait(BOUND_S), "the batch never started"

    started = time.monotonic()
    loop.close(timeout_s=0.2)
    assert time.monotonic() - started < BOUND_S
    loop_thread = loop.send_threads[0]
    assert loop_thread.is_alive()  # still stuck in _send

    # Once the send returns, the closed loop sends what it holds and ends.
    loop.release.set()
    wait_for(lambda: not loop_thread.is_alive(), timeout=BOUND_S, message="the loop to end")
    assert loop.sent == [[1]]


def test_run_after_none_is_a_no_op(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="worker.sqs.batchloop"):
        run_after(None, "after-batch step failed")
    assert caplog.records == []


def test_run_after_runs_the_step_once() -> None:
    calls: list[str] = []
    run_after(lambda: calls.append("ran"), "after-batch step failed")
    assert calls == ["ran"]


def test_run_after_logs_a_raising_step_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def step() -> None:
        raise ValueError("delete callback broke")

    with caplog.at_level(logging.ERROR, logger="worker.sqs.batchloop"):
        run_after(step, "after-publish step failed", eventId="ev-1")

    [record] = caplog.records
    assert record.name == "worker.sqs.batchloop"
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "after-publish step failed"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert record.__dict__["eventId"] == "ev-1"


def test_close_sends_a_pending_batch_at_once(make_loop: MakeLoop) -> None:
    # Shutdown must not wait out the window: close() flushes, and a flush sends at once.
    loop = make_loop(delay_s=30.0)
    loop.add(1)
    started = time.monotonic()
    loop.close(timeout_s=BOUND_S)  # waiting out the window would take all of BOUND_S
    assert loop.sent == [[1]]
    assert time.monotonic() - started < BOUND_S / 2


def test_after_close_inline_sends_keep_max_batch(make_loop: MakeLoop) -> None:
    loop = make_loop(max_batch=2)
    loop.close(timeout_s=BOUND_S)
    loop.add(1, 2, 3)
    assert all(len(batch) <= 2 for batch in loop.sent), loop.sent


def test_after_close_a_failed_inline_send_goes_to_failed(make_loop: MakeLoop) -> None:
    loop = make_loop()
    loop.fail_when = lambda batch: 13 in batch
    loop.close(timeout_s=BOUND_S)
    loop.add(13)  # handled like a failed send in the loop, not raised into the caller
    assert loop.failed == [[13]]
