"""The two readers of JSON agentq did not write, against any text a sender could send."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentq.errors import InvalidInput
from agentq.json_text import MAX_NESTING, decode_json, decode_lenient, decode_or_none, nesting

PROPERTIES = settings(max_examples=300, deadline=None, database=None)

_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
# Text that is JSON, nearly JSON, or hostile to json's decoder: deep, long, odd words.
_TEXTS = (
    st.text(max_size=60)
    | _JSON_VALUES.map(json.dumps)
    | st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
    | st.integers(4000, 6000).map(lambda n: "9" * n)
    | st.sampled_from(["NaN", "-Infinity", "1e999", '{"a": NaN}', '"\\ud800"'])
)  # fmt: skip


def _same(left: Any, right: Any) -> bool:
    # NaN is never equal to itself; compare the JSON it writes back.
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


@PROPERTIES
@given(data=_TEXTS | st.binary(max_size=60))
@example(data="[" * 100_000)
@example(data=b"\xff{}")
def test_lenient_reads_what_json_reads_and_refuses_the_rest_as_invalid_input(
    data: str | bytes,
) -> None:
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError):
        with pytest.raises(InvalidInput) as refused:
            decode_lenient(data, name="s3://b/k", what="result")
        assert refused.value.field == "s3://b/k"
        assert refused.value.problem.startswith("result is not JSON")
    else:
        assert _same(decode_lenient(data, name="s3://b/k"), expected)


@PROPERTIES
@given(text=_TEXTS)
def test_strict_reads_only_finite_shallow_json(text: str) -> None:
    try:
        value = decode_json(text, name="body")
    except InvalidInput as refused:
        assert refused.field == "body"
        return
    # What it accepted is plain JSON: it writes back without NaN or Infinity.
    assert _same(json.loads(json.dumps(value, allow_nan=False)), value)
    assert nesting(text) <= MAX_NESTING


@PROPERTIES
@given(text=_TEXTS)
def test_decode_or_none_never_raises(text: str) -> None:
    value = decode_or_none(text)
    if nesting(text) > MAX_NESTING:
        assert value is None
    elif value is not None and "NaN" not in text and "Infinity" not in text:
        assert _same(value, json.loads(text))


def test_strict_refuses_what_lenient_accepts() -> None:
    for text in ("NaN", '{"a": 1e999}', "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)):
        assert decode_lenient(text, name="t") is not None
        with pytest.raises(InvalidInput):
            decode_json(text, name="t")
    deepest = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert decode_json(deepest) == decode_lenient(deepest, name="t")


def test_a_syntax_error_names_where() -> None:
    with pytest.raises(InvalidInput, match=r"trace is not JSON: Expecting value at 5"):
        decode_lenient('{"a":}', name="s3://b/t", what="trace")
    assert decode_or_none('{"requestId": "r-1", "x": NaN}') == {"requestId": "r-1", "x": None}
