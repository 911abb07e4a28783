"""The chaos verdict's overlap measure: time two attempts of one task both ran."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.chaos_model import Freeze
from bench.chaos_verify import Execution, frozen_windows, overlap_s

times = st.floats(min_value=0, max_value=100, allow_nan=False)


def _run(pid: int, start: float, length: float, attempt: int) -> Execution:
    return Execution(request_id="r", attempt=attempt, pid=pid, start=start, end=start + length)


@given(times, times, times, times)
def test_overlap_is_the_shared_span_of_two_runs(a: float, la: float, b: float, lb: float) -> None:
    before, after = sorted([_run(1, a, la, 1), _run(2, b, lb, 2)], key=lambda e: e.start)
    overlap = overlap_s(before, after, {}, horizon=1_000)
    assert before.end is not None and after.end is not None
    shared = max(0.0, min(before.end, after.end) - after.start)
    assert abs(overlap - shared) < 1e-9
    assert 0 <= overlap <= min(before.end - before.start, after.end - after.start) + 1e-9


@given(times, times, times, times, st.floats(min_value=0, max_value=1))
def test_time_spent_frozen_is_not_execution(
    a: float, la: float, b: float, lb: float, share: float
) -> None:
    before, after = sorted([_run(1, a, la, 1), _run(2, b, lb, 2)], key=lambda e: e.start)
    assert before.end is not None
    # Frozen over part of the first run: never more overlap than without the freeze.
    since = before.start + share * (before.end - before.start)
    freeze = Freeze(at=since, until=before.end, worker="w0", worker_id="w0.1", pids=(before.pid,))
    frozen = frozen_windows([freeze])
    plain = overlap_s(before, after, {}, horizon=1_000)
    assert 0 <= overlap_s(before, after, frozen, horizon=1_000) <= plain + 1e-9
    # Frozen all the while the second ran: no overlap at all.
    whole = Freeze(
        at=before.start, until=before.end, worker="w0", worker_id="w0.1", pids=(before.pid,)
    )
    assert overlap_s(before, after, frozen_windows([whole]), horizon=1_000) < 1e-9


def test_an_unfinished_run_is_bounded_by_the_horizon() -> None:
    before = Execution(request_id="r", attempt=1, pid=1, start=0.0)
    after = _run(2, 5.0, 10.0, 2)
    assert overlap_s(before, after, {}, horizon=8.0) == 3.0
