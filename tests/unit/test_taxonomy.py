from __future__ import annotations

import errno
import json
import pickle

import pytest
from botocore.exceptions import ClientError

from agentq.errors import InvalidRequestId, TaskError, TaskHeldElsewhere
from agentq.taxonomy import RETRYABLE, classify_exception, classify_status, from_record


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


def _json_error() -> json.JSONDecodeError:
    try:
        json.loads("{nope")
    except json.JSONDecodeError as exc:
        return exc
    raise AssertionError


# One case per row of the taxonomy in ARCHITECTURE.md.
@pytest.mark.parametrize(
    ("exc", "category", "retryable"),
    [
        (_HttpError(401), "auth", False),
        (InvalidRequestId("bad id!"), "validation", False),
        (_json_error(), "parse", False),
        (FileNotFoundError(errno.ENOENT, "missing", "input.json"), "not_found", False),
        (TypeError("unsupported operand"), "programming", False),
        (TimeoutError("step timed out"), "timeout", True),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "network", True),
        (_HttpError(429), "rate_limit", True),
        (_HttpError(503), "server", True),
    ],
)
def test_each_taxonomy_row(exc: BaseException, category: str, retryable: bool) -> None:
    info = classify_exception(exc)
    assert info.category == category
    assert info.retryable is retryable
    assert info.exception_type == type(exc).__name__


@pytest.mark.parametrize(
    ("status", "category"),
    [(400, "validation"), (401, "auth"), (403, "auth"), (404, "not_found"),
     (429, "rate_limit"), (529, "rate_limit"), (500, "server"), (502, "server"),
     (504, "timeout")],
)  # fmt: skip
def test_http_statuses(status: int, category: str) -> None:
    assert classify_status(status) == category


def test_botocore_client_error_uses_http_status() -> None:
    error = ClientError(
        {"Error": {"Code": "Throttling", "Message": "slow down"},
         "ResponseMetadata": {"HTTPStatusCode": 429, "RequestId": "r-1", "HostId": "",
                              "HTTPHeaders": {}, "RetryAttempts": 0}},
        "PutEvents",
    )  # fmt: skip
    assert classify_exception(error).category == "rate_limit"


def test_overloaded_text_is_rate_limit() -> None:
    assert classify_exception(RuntimeError("API error: Overloaded")).category == "rate_limit"


def test_unknown_failures_are_not_retried() -> None:
    info = classify_exception(RuntimeError("something odd"))
    assert info.category not in RETRYABLE and not info.retryable


def test_child_record_round_trip_and_malformed_record() -> None:
    record = {"category": "network", "retryable": True, "message": "reset",
              "exception_type": "ConnectionResetError"}  # fmt: skip
    info = from_record(record)
    assert (info.category, info.retryable) == ("network", True)
    assert from_record({"category": "auth", "retryable": True}).retryable is False
    assert from_record({"category": "banana"}).category == "parse"


def test_messages_are_sanitized() -> None:
    info = classify_exception(
        RuntimeError("failed with key sk-ant-api03-abcdefghijklmnop for ops@example.com")
    )
    assert "sk-ant" not in info.message
    assert "example.com" not in info.message


def test_task_error_keeps_its_classification() -> None:
    info = classify_exception(TaskError("rate_limit", "429", retryable=True))
    assert (info.category, info.retryable) == ("rate_limit", True)


def test_exceptions_pickle_with_their_fields() -> None:
    original = TaskHeldElsewhere("r1", "worker-a", 1234)
    copy = pickle.loads(pickle.dumps(original))
    assert isinstance(copy, TaskHeldElsewhere)
    assert (copy.request_id, copy.owner, copy.effective_until_ms) == ("r1", "worker-a", 1234)
    assert str(copy) == str(original)
