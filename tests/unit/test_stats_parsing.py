"""`agentq stats`' window parser and its percentile, as properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.errors import InvalidInput
from agentq.stats import MAX_WINDOW_S, parse_window, percentile

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


@given(st.integers(min_value=1, max_value=10_000), st.sampled_from(sorted(UNITS)))
def test_a_number_and_a_unit_is_that_many_seconds_up_to_seven_days(n: int, unit: str) -> None:
    seconds = n * UNITS[unit]
    if seconds <= MAX_WINDOW_S:
        assert parse_window(f"{n}{unit}") == seconds
    else:
        with pytest.raises(InvalidInput):
            parse_window(f"{n}{unit}")


@given(st.text(max_size=20))
def test_anything_else_is_refused_as_invalid_input_never_a_crash(text: str) -> None:
    try:
        seconds = parse_window(text)
    except InvalidInput as error:
        assert error.field == "window"
    else:
        assert 1 <= seconds <= MAX_WINDOW_S
        assert text.strip()[-1] in UNITS and text.strip()[:-1].isascii()


@pytest.mark.parametrize("text", ["0m", "15", "m", "-5m", "1.5h", "15 m", "1w", "015m"])
def test_refused_windows(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_window(text)


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=200))
def test_a_percentile_is_a_value_with_at_least_that_share_at_or_below_it(
    values: list[int],
) -> None:
    ordered = sorted(values)
    for fraction in (0.5, 0.95):
        found = percentile(ordered, fraction)
        assert found in ordered
        at_or_below = sum(1 for v in ordered if v <= found)
        assert at_or_below >= math.ceil(fraction * len(ordered))
        assert sum(1 for v in ordered if v < found) < math.ceil(fraction * len(ordered))
    assert percentile(ordered, 0.5) <= percentile(ordered, 0.95)  # type: ignore[operator]


def test_no_values_no_percentile() -> None:
    assert percentile([], 0.5) is None
