"""The envelope parser against anything a producer could send (Hypothesis).

Whatever the body and attributes, `parse_message` returns an envelope agentq can store
and send, or raises `InvalidInput` naming the field; `identity_hint` never raises.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from security_support import HOSTILE, SQS_TEXT, Hostile

from agentq.envelope import (
    MAX_ENVELOPE_DEPTH,
    REQUEST_ID_PATTERN,
    TaskEnvelope,
    identity_hint,
    parse_message,
)
from agentq.errors import InvalidInput
from agentq.store.codec import to_item

PROPERTIES = settings(max_examples=400, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in a body agentq wrote")

    return json.loads(text, parse_constant=refuse)


def _keys(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from _keys(child)
    elif isinstance(value, list):
        for child in value:
            yield from _keys(child)


def _assert_storable(envelope: TaskEnvelope) -> None:
    # DynamoDB refuses an empty or 64 KiB map key at any depth (boto3's serializer does not).
    assert all(0 < len(key.encode()) < 65_536 for key in _keys(envelope.to_dict()))
    body = envelope.to_body()
    body.encode("utf-8")  # no lone surrogate survives
    assert _strict(body) == envelope.to_dict()
    assert _depth(envelope.to_dict()) <= MAX_ENVELOPE_DEPTH
    to_item({"envelope": envelope.to_dict()})  # boto3's DynamoDB serializer takes it
    again = parse_message(body, envelope.message_attributes(), default_tenant="other")
    assert again == envelope


@PROPERTIES
@given(shape=HOSTILE)
@example(shape=Hostile("envelope", "sample-noop", None, "same", {"x": float("inf")}, 0, None, "x"))
@example(shape=Hostile("envelope", "sample-noop", None, "same", {"x": float("nan")}, 0, None, "x"))
@example(shape=Hostile("envelope", "sample-noop", None, "same", {}, 10_000, "String", "x"))
@example(shape=Hostile("envelope", "sample-noop", None, "same", {"x": "\ud800"}, 0, None, "x"))
@example(shape=Hostile("envelope", "sample-noop", None, "absent", {}, 0, "Number", "x"))
@example(shape=Hostile("envelope", "sample-noop", None, "same", {"x": {"": {}}}, 0, None, "x"))
def test_parse_message_accepts_only_what_agentq_can_store(shape: Hostile) -> None:
    request_id = "r-" + uuid.uuid4().hex[:8]
    body, attributes, readable = shape.build(request_id)
    hint, _ = identity_hint(body, attributes)
    if readable:
        assert hint == request_id
    assert hint is None or REQUEST_ID_PATTERN.fullmatch(hint)
    try:
        envelope = parse_message(body, attributes, default_tenant="acme")
    except InvalidInput as exc:
        assert exc.field and exc.problem
        str(exc).encode("utf-8")  # the cause can be reported and stored as it is
        return
    _assert_storable(envelope)
    # The id a rejection would be reported under is the id the task runs under.
    assert envelope.request_id == hint
    if shape.kind != "raw":
        # A task's own resume is JSON true or false, kept as sent; anything else is refused.
        assert shape.resume is None or isinstance(shape.resume, bool)
        assert envelope.resume is shape.resume


@PROPERTIES
@given(body=st.text(SQS_TEXT, max_size=200) | st.text(max_size=200))
def test_parse_message_and_identity_hint_take_any_text(body: str) -> None:
    identity_hint(body, None)
    with contextlib.suppress(InvalidInput):
        _assert_storable(parse_message(body, None, default_tenant="acme"))


STORABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**37), 10**37)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f == 0 or 1e-120 < abs(f) < 1e120)
    | st.text(st.characters(codec="utf-8"), max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.characters(codec="utf-8"), min_size=1, max_size=8),
                      inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@PROPERTIES
@given(
    request_id=st.from_regex(r"[a-zA-Z0-9_-]{1,40}", fullmatch=True),
    tenant=st.from_regex(r"[a-zA-Z0-9_.-]{1,20}", fullmatch=True),
    payload=st.dictionaries(st.text(st.characters(codec="utf-8"), min_size=1, max_size=8),
                            STORABLE, max_size=5),
    resume=st.none() | st.booleans(),
)  # fmt: skip
def test_every_storable_envelope_round_trips(
    request_id: str, tenant: str, payload: Any, resume: bool | None
) -> None:
    envelope = TaskEnvelope(request_id=request_id, tenant=tenant, definition="d",
                            input=payload, resume=resume)  # fmt: skip
    _assert_storable(envelope)
    # Written only when the task sets it: a body without it is the definition's choice.
    assert ("resume" in envelope.to_dict()) is (resume is not None)
    assert TaskEnvelope.from_dict(envelope.to_dict(), default_tenant="other") == envelope


@pytest.mark.parametrize(
    ("body", "attributes", "field", "cause"),
    [
        ('{"requestId":"a","definition":"d","input":{"x":1e309}}', None, "body", "out of range"),
        ('{"requestId":"a","definition":"d","input":{"x":NaN}}', None, "body", "NaN"),
        ('{"requestId":"a","definition":"d","input":' + "[" * 10_000 + "]" * 10_000 + "}",
         None, "body", "nested"),
        ('{"requestId":"a","definition":"d","input":{"x":"\\ud800"}}', None, "input.x",
         "surrogate"),
        ('{"definition":"d"}', {"requestId": {"DataType": "Number", "StringValue": "12"}},
         "requestId", "DataType String"),
        ('{"requestId":"a","definition":"d","input":{"x":' + "9" * 50 + "}}", None, "input.x",
         "38 digits"),
        ('{"requestId":"a","definition":"d","input":{"":1}}', None, "input", "empty key"),
        ('{"requestId":"a","definition":"d","notBefore":1e200}', None, "notBefore", "9999"),
        ('{"requestId":"a","definition":"d","notBefore":"300000000000000"}', None, "notBefore",
         "9999"),
        ('{"requestId":"a","definition":"d","submittedAt":4503599627370496,"delay":5}', None,
         "submittedAt", "9999"),
        ('{"requestId":"a","definition":"d","input":{"x":[{"":{}}]}}', None, "input.x[0]",
         "empty key"),
        ('{"requestId":"a","definition":"d","input":{"' + "k" * 65_536 + '":1}}', None,
         "input", "under 64 KiB"),
    ],
)  # fmt: skip
def test_reproduced_poison_is_refused_naming_the_cause(
    body: str, attributes: dict[str, Any] | None, field: str, cause: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_message(body, attributes, default_tenant="acme")
    assert refused.value.field == field
    assert cause in refused.value.problem


@PROPERTIES
@given(rest=st.text(SQS_TEXT, min_size=30, max_size=300))
def test_a_long_invalid_value_is_never_quoted_back(rest: str) -> None:
    """A cut secret would leak its prefix past the redaction of the whole value."""
    value = "PLANTEDMARK " + rest  # the space makes it an invalid tenant
    body = json.dumps({"requestId": "r-1", "tenant": value, "definition": "d"})
    with pytest.raises(InvalidInput) as refused:
        parse_message(body, None, default_tenant="acme")
    assert "PLANTEDMARK" not in str(refused.value)
    assert f"a text of {len(value)} characters" in str(refused.value)


@PROPERTIES
@given(
    source=st.from_regex(r"[a-zA-Z0-9_-]{1,40}", fullmatch=True),
    prompt=st.text(st.characters(codec="utf-8"), min_size=1, max_size=200),
)
def test_every_storable_continuation_round_trips(source: str, prompt: str) -> None:
    try:
        envelope = TaskEnvelope(request_id="r-continuing", tenant="acme", definition="d",
                                continues=source, prompt=prompt, resume=True)  # fmt: skip
    except InvalidInput as exc:
        assert exc.field in ("continues", "prompt")
        return
    _assert_storable(envelope)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"continues": "a b", "prompt": "p"}, "continues"),
        ({"continues": "src"}, "prompt"),
        ({"prompt": "p"}, "prompt"),
        ({"continues": "src", "prompt": ""}, "prompt"),
        ({"continues": "src", "prompt": 7}, "prompt"),
        ({"continues": "src", "prompt": "\ud800"}, "prompt"),
        ({"continues": "a", "prompt": "p"}, "continues"),  # the task itself
    ],
)
def test_a_malformed_continuation_is_refused_naming_the_field(
    extra: dict[str, Any], field: str
) -> None:
    body = json.dumps({"requestId": "a", "definition": "d", **extra})
    with pytest.raises(InvalidInput) as refused:
        parse_message(body, None, default_tenant="acme")
    assert refused.value.field == field


@pytest.mark.parametrize("value", ["true", 1, 0, "", [], {}, 1.0])
def test_a_resume_that_is_not_true_or_false_is_refused_naming_it(value: Any) -> None:
    body = json.dumps({"requestId": "a", "definition": "d", "resume": value})
    with pytest.raises(InvalidInput) as refused:
        parse_message(body, None, default_tenant="acme")
    assert refused.value.field == "resume"
    assert "must be true or false" in refused.value.problem
    with pytest.raises(InvalidInput):
        TaskEnvelope(request_id="a", tenant="acme", definition="d", resume=value)


@pytest.mark.parametrize("value", [True, False])
def test_a_resume_of_true_or_false_is_the_tasks_own(value: bool) -> None:
    body = json.dumps({"requestId": "a", "definition": "d", "resume": value})
    envelope = parse_message(body, None, default_tenant="acme")
    assert envelope.resume is value and envelope.to_dict()["resume"] is value
    # Absent (or null), the definition decides, and nothing is written for it.
    unset = parse_message('{"requestId":"a","definition":"d","resume":null}', None,
                          default_tenant="acme")  # fmt: skip
    assert unset.resume is None and "resume" not in unset.to_dict()
