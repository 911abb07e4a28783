"""The validators of tenant limits (an operator's N, a value read back from the table)
and the seat arithmetic, as properties over any input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.cli.tenants import parse_limit
from agentq.errors import InvalidInput
from agentq.store.tenants import (
    MAX_LIMIT,
    Seat,
    free_seats,
    seat_start,
    stored_limit,
    validate_limit,
    validate_tenant,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=8,
)


@given(st.text())
def test_an_operators_limit_is_a_bounded_integer_or_default_or_refused(text: str) -> None:
    try:
        parsed = parse_limit(text)
    except InvalidInput as refused:
        assert refused.field == "N"
        if len(text) > 40:
            assert f"a text of {len(text)} characters" in str(refused), "not quoted back"
        return
    if parsed is None:
        assert text.strip().lower() == "default"
    else:
        assert 0 <= parsed <= MAX_LIMIT and int(text.strip()) == parsed


@given(st.integers(min_value=0, max_value=MAX_LIMIT))
def test_every_limit_in_range_round_trips(limit: int) -> None:
    assert parse_limit(str(limit)) == limit == validate_limit(limit) == stored_limit(limit)


@pytest.mark.parametrize("text", ["-1", "1001", "1.5", "two", "", "٣", "1e3", "0x10"])
def test_limits_out_of_range_or_not_decimal_are_refused(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_limit(text)


@given(_json)
def test_a_stored_limit_is_a_limit_or_ignored(value: Any) -> None:
    found = stored_limit(value)
    assert found is None or (isinstance(found, int) and 0 <= found <= MAX_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int | float):
        assert found is None


@given(st.text(max_size=200))
def test_a_tenant_is_refused_unless_it_is_a_tenant_name(text: str) -> None:
    try:
        assert validate_tenant(text) == text
    except InvalidInput:
        return
    assert 1 <= len(text) <= 128 and "#" not in text


@given(
    limit=st.integers(min_value=1, max_value=50),
    seats=st.lists(
        st.tuples(st.integers(min_value=0, max_value=60), st.booleans(), st.integers(-5, 5)),
        max_size=60,
        unique_by=lambda s: s[0],
    ),
)
def test_free_seats_are_the_indices_below_the_limit_no_live_lease_holds(
    limit: int, seats: list[tuple[int, bool, int]]
) -> None:
    now = 1_000
    found = [
        Seat(
            index=i,
            holder="h" if held else None,
            request_id=None,
            worker_id=None,
            lease_until_ms=now + offset,
        )
        for i, held, offset in seats
    ]
    live = {s.index for s in found if s.live(now)}
    free = free_seats(found, limit, now)
    assert free == sorted(set(range(limit)) - live)


@given(st.from_regex(r"[a-zA-Z0-9_-]{1,256}", fullmatch=True), st.integers(1, MAX_LIMIT))
def test_the_first_seat_is_below_the_limit_and_stable(request_id: str, limit: int) -> None:
    assert 0 <= seat_start(request_id, limit) < limit
    assert seat_start(request_id, limit) == seat_start(request_id, limit)
