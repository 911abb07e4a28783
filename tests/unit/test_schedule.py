"""Parsing when a delayed task may run: `delay`, `not_before`, and the envelope's field."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.envelope import TaskEnvelope, parse_message
from agentq.errors import InvalidInput
from agentq.schedule import MAX_DELAY_S, parse_time_ms, resolve_not_before
from agentq.states import TaskState, can_transition

NOW = 1_800_000_000_000  # 2027-01-15, in ms
times = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(4000, 1, 1), timezones=st.just(UTC)
)


@given(times)
def test_an_iso_time_with_a_zone_reads_back_to_the_same_millisecond(moment: datetime) -> None:
    moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    expected = int(moment.timestamp() * 1000)
    assert parse_time_ms(moment.isoformat()) == expected
    assert parse_time_ms(moment.isoformat().replace("+00:00", "Z")) == expected
    shifted = moment.astimezone(datetime.now(UTC).astimezone().tzinfo)
    assert parse_time_ms(shifted.isoformat()) == expected


@given(st.integers(min_value=0, max_value=10**11 - 1))
def test_epoch_seconds_and_milliseconds_are_told_apart(seconds: int) -> None:
    assert parse_time_ms(seconds) == seconds * 1000
    assert parse_time_ms(str(seconds)) == seconds * 1000
    if seconds * 1000 >= 10**11:
        assert parse_time_ms(seconds * 1000) == seconds * 1000


@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_as_invalid_input(text: str) -> None:
    try:
        value = parse_time_ms(text)
    except InvalidInput as error:
        assert error.field == "not_before"
    else:
        assert value >= 0


@pytest.mark.parametrize(
    "bad", ["2026-11-26T12:00:00", "tomorrow", "", -5, float("nan"), float("inf"), True, [1]]
)
def test_naive_times_negative_and_odd_values_are_refused(bad: object) -> None:
    with pytest.raises(InvalidInput):
        parse_time_ms(bad)


@given(st.floats(min_value=0, max_value=MAX_DELAY_S, allow_nan=False))
def test_a_delay_is_counted_from_now_and_zero_means_at_once(delay: float) -> None:
    due = resolve_not_before(delay_s=delay, now_ms=NOW)
    if int(delay * 1000) == 0:
        assert due is None
    else:
        assert due == NOW + int(delay * 1000)


def test_delay_and_not_before_are_exclusive_and_bounded() -> None:
    with pytest.raises(InvalidInput, match="either"):
        resolve_not_before(delay_s=5, not_before=NOW, now_ms=NOW)
    for bad in (-1, MAX_DELAY_S + 1, "10", float("inf")):
        with pytest.raises(InvalidInput):
            resolve_not_before(delay_s=bad, now_ms=NOW)
    with pytest.raises(InvalidInput, match="a year"):
        resolve_not_before(not_before=NOW + (MAX_DELAY_S + 60) * 1000, now_ms=NOW)
    assert resolve_not_before(not_before=NOW - 1000, now_ms=NOW) is None  # past: at once
    assert resolve_not_before(now_ms=NOW) is None


def test_a_task_requested_event_counts_its_delay_from_the_event_time() -> None:
    sent = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    event = {
        "detail-type": "Task Requested",
        "time": sent.isoformat().replace("+00:00", "Z"),
        "detail": {"requestId": "r-1", "definition": "noop", "delay": 1200},
    }
    envelope = parse_message(json.dumps(event), None, default_tenant="acme")
    assert envelope.not_before_ms == int((sent + timedelta(seconds=1200)).timestamp() * 1000)
    # On the queue the time travels as epoch ms, and reads back unchanged.
    again = parse_message(envelope.to_body(), None, default_tenant="acme")
    assert again.not_before_ms == envelope.not_before_ms


def test_a_foreign_delay_without_a_submit_time_is_refused() -> None:
    body = json.dumps({"requestId": "r-1", "definition": "noop", "delay": 60})
    with pytest.raises(InvalidInput, match="submittedAt"):
        parse_message(body, None, default_tenant="acme")
    iso = json.dumps({"requestId": "r-1", "definition": "noop", "notBefore": "2030-01-01T00:00Z"})
    assert parse_message(iso, None, default_tenant="acme").not_before_ms == parse_time_ms(
        "2030-01-01T00:00:00+00:00"
    )


def test_an_undelayed_envelope_is_unchanged_on_the_wire() -> None:
    envelope = TaskEnvelope(request_id="r-1", tenant="acme", definition="noop")
    assert "notBefore" not in envelope.to_dict()


def test_scheduled_and_cancel_edges_of_the_state_machine() -> None:
    assert can_transition(TaskState.SCHEDULED, TaskState.PROCESSING)
    assert can_transition(TaskState.SCHEDULED, TaskState.CANCELLED)
    assert can_transition(TaskState.BLOCKED, TaskState.SCHEDULED)
    assert can_transition(TaskState.PROCESSING, TaskState.CANCELLED)
    assert not can_transition(TaskState.SCHEDULED, TaskState.COMPLETED)
    assert not TaskState.SCHEDULED.terminal and not TaskState.SCHEDULED.lockable
