"""The secret sanitizers against any value (Hypothesis): a remembered secret never
survives, raw or as written inside JSON; a name that marks no secret keeps its value."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq import security
from worker.settle.scrub import child_line

SECRET_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                       min_size=security.MIN_SECRET_LENGTH, max_size=60)  # fmt: skip
SECRET_NAME = st.sampled_from(["ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                               "SLACK_BOT_TOKEN", "DB_PASSWORD", "MY_SERVICE_SECRET",
                               "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"])  # fmt: skip
PLAIN_NAME = st.sampled_from(["PATH", "LOG_LEVEL", "MAX_OUTPUT_TOKENS", "KEYBOARD", "TENANT_ID"])
SURROUNDING = st.text(max_size=30)
CHECKS = settings(max_examples=300, deadline=None, database=None)


@pytest.fixture(autouse=True)
def forget() -> Iterator[None]:
    yield
    security.remember_environment({})


@CHECKS
@given(name=SECRET_NAME, value=SECRET_VALUE, before=SURROUNDING, after=SURROUNDING)
def test_a_remembered_secret_never_survives(name: str, value: str, before: str, after: str) -> None:
    security.remember_environment({name: value})
    text = before + value + after
    assert value not in security.redact_known(text)
    assert value not in security.sanitize_error_message(text, limit=10_000)
    assert value not in child_line(text)
    written = json.dumps({"message": text})
    assert json.dumps(value)[1:-1] not in security.redact_known(written)
    assert value.encode() not in security.redact_known_bytes(text.encode())
    stream = io.StringIO()
    security.ScrubbingStream(stream).write(text + "\n")
    assert value not in stream.getvalue()


@CHECKS
@given(name=PLAIN_NAME, value=SECRET_VALUE.filter(lambda v: "REDACTED" not in v))
def test_a_setting_is_not_taken_for_a_secret(name: str, value: str) -> None:
    security.remember_environment({name: value})
    assert security.redact_known(f"x {value} y") == f"x {value} y"


@given(value=st.text(max_size=security.MIN_SECRET_LENGTH - 1))
def test_short_values_are_settings_not_secrets(value: str) -> None:
    assert security.environment_secrets({"SOME_TOKEN": value}) == []


@CHECKS
@given(
    message=st.lists(st.text(max_size=10) | st.sampled_from(["\ud800", "\udfff", "\x00", "\x7f"]),
                     max_size=8).map("".join),
    limit=st.integers(20, 200),
)  # fmt: skip
def test_a_sanitized_message_is_bounded_text_any_aws_call_can_carry(
    message: str, limit: int
) -> None:
    # A child's error.json may hold lone surrogates ("\ud800" decodes to one) and
    # control characters; what the sanitizer returns goes to DynamoDB and EventBridge.
    cleaned = security.sanitize_error_message(message, limit=limit)
    cleaned.encode("utf-8")
    assert len(cleaned) <= limit
    assert not any((ord(c) < 0x20 and c not in "\t\n\r") or c == "\x7f" for c in cleaned)


BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+"
AWS_SECRET_SHAPED = st.text(st.sampled_from(BASE64), min_size=40, max_size=40).filter(
    lambda key: any(c.isupper() for c in key) and any(c.islower() for c in key)
)
HEX_ID = st.text(st.sampled_from("0123456789abcdef"), min_size=32, max_size=32)


@CHECKS
@given(key=AWS_SECRET_SHAPED, before=st.sampled_from(["", "key ", "(", "secret='"]))
def test_a_standalone_aws_secret_shape_is_redacted(key: str, before: str) -> None:
    assert key not in security.sanitize_error_message(f"{before}{key} rest", limit=10_000)


@CHECKS
@given(request_id=HEX_ID, attempt=st.integers(1, 9), prefix=st.sampled_from(["idem-", ""]))
def test_an_artifact_path_keeps_its_request_id(request_id: str, attempt: int, prefix: str) -> None:
    # `<request id>/attempt-N` is 40 characters of the secret alphabet, in one case.
    path = f"s3://agentq-artifacts/task/default/{prefix}{request_id}/attempt-{attempt}/out.json"
    message = f"agent trace '{path}' not found"
    assert security.sanitize_error_message(message, limit=10_000) == message
