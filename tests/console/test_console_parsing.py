"""Property tests of what the console parses from the browser and embeds into pages."""

from __future__ import annotations

import base64
import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.console.app import embed_json
from agentq.console.cursor import decode_cursor, encode_cursor
from agentq.console.deadletters import validate_archive_key
from agentq.console.reads import MAX_PAGE, job_state_filter, page_size, validate_tenant
from agentq.console.security import Gate
from agentq.dlq import archive_key
from agentq.errors import InvalidInput
from agentq.store import keys

IDS = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=40)
TENANTS = st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=40)
VALUES = st.text(min_size=1, max_size=200)


@given(tenant=TENANTS, pk=VALUES, sk=VALUES, tenant_sk=VALUES)
def test_a_cursor_round_trips_for_its_tenant(tenant: str, pk: str, sk: str, tenant_sk: str) -> None:
    key = {"PK": {"S": pk}, "SK": {"S": sk}, "tenantPK": {"S": keys.tenant_jobs_pk(tenant)},
           "tenantSK": {"S": tenant_sk}}  # fmt: skip
    cursor = encode_cursor(key)
    assert set(cursor) <= set(string.ascii_letters + string.digits + "-_")  # URL-safe as is
    assert decode_cursor(cursor, tenant) == key
    with pytest.raises(InvalidInput):
        decode_cursor(cursor, tenant + "x")


@given(st.text(max_size=300))
def test_any_text_is_a_valid_cursor_or_invalid_input(text: str) -> None:
    try:
        key = decode_cursor(text, "default")
    except InvalidInput:
        return
    assert set(key) == {"PK", "SK", "tenantPK", "tenantSK"}
    assert all(set(v) == {"S"} and isinstance(v["S"], str) for v in key.values())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# What a crafted cursor may decode to: any JSON, and the hostile JSON a text strategy
# never reaches (brackets thousands deep, which json's decoder recurses into; integers
# past Python's 4,300-digit conversion limit; bytes that are not UTF-8).
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
CRAFTED = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda n, o: (o * n).encode(), st.integers(0, 3000), st.sampled_from(["[", '{"a":'])),
    st.integers(4301, 5000).map(lambda n: b"9" * n),
    st.binary(max_size=300),
)


@given(CRAFTED)
def test_any_crafted_cursor_is_a_valid_cursor_or_invalid_input(raw: bytes) -> None:
    cursor = _b64(raw)
    try:
        key = decode_cursor(cursor, "default")
    except InvalidInput as error:
        assert error.field == "cursor"
        return
    assert set(key) == {"PK", "SK", "tenantPK", "tenantSK"}


def test_a_cursor_nested_thousands_deep_is_invalid_input() -> None:
    # base64 of 3,000 brackets is 4,000 characters: under the length limit, so only
    # decoding stands between it and a RecursionError (a 500, not the 400 of a bad cursor).
    with pytest.raises(InvalidInput, match="not a cursor this console made"):
        decode_cursor(_b64(b"[" * 3000), "default")


@given(st.one_of(st.text(max_size=12), st.none(), st.integers()))
def test_page_sizes_are_bounded_or_refused(value: Any) -> None:
    try:
        size = page_size(value)
    except InvalidInput:
        return
    assert 1 <= size <= MAX_PAGE


@given(st.text(max_size=12))
def test_state_filters_are_job_states_or_refused(value: str) -> None:
    try:
        state = job_state_filter(value)
    except InvalidInput:
        return
    assert state in (None, "RUNNING", "COMPLETED", "FAILED")


@given(st.text(max_size=140))
def test_tenants_are_validated(value: str) -> None:
    try:
        assert validate_tenant(value) == value
    except InvalidInput:
        return
    assert value and all(c in string.ascii_letters + string.digits + "_.-" for c in value)


@given(tenant=TENANTS, request_id=IDS, message_id=IDS)
def test_archive_keys_of_the_archive_are_accepted(
    tenant: str, request_id: str, message_id: str
) -> None:
    key = archive_key(tenant, request_id, message_id)
    assert validate_archive_key(key) == key


@given(st.text(max_size=200))
def test_other_keys_are_refused(value: str) -> None:
    try:
        validate_archive_key(value)
    except InvalidInput:
        return
    # Exactly {prefix}{tenant}/{requestId}/{messageId}.json, nothing around it.
    assert value.startswith("dlq/archive/") and value.endswith(".json")
    assert value.count("/") == 4 and "\n" not in value


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON)
def test_embedded_json_cannot_close_its_script_element(value: Any) -> None:
    text = embed_json(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value


@pytest.mark.parametrize("payload", ["</script><script>alert(1)</script>", "<!--", "]]>"])
def test_embedded_json_of_known_attacks(payload: str) -> None:
    text = embed_json({"input": payload})
    assert "</script" not in text.lower() and "<!--" not in text
    assert json.loads(text) == {"input": payload}


@given(st.text(max_size=80))
def test_no_made_up_cookie_or_token_opens_the_console(text: str) -> None:
    gate = Gate()
    opened = gate.open_session()
    assert gate.session(text) in (None, opened)
    assert gate.session(text) != opened or text == opened
    assert gate.token_ok(text) == (text == gate.token)
