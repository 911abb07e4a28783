"""The error taxonomy: every failure becomes a category, and the category decides retries.

| category    | retryable |
|-------------|-----------|
| auth        | no        |
| validation  | no        |
| parse       | no        |
| not_found   | no        |
| programming | no        |
| timeout     | yes (an attempt-level timeout; a worker kill is terminal) |
| network     | yes       |
| rate_limit  | yes       |
| server      | yes       |
"""

from __future__ import annotations

import errno
import json
import re
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, cast, get_args

from agentq.errors import InvalidInput, TaskError
from agentq.security import sanitize_error_message

ErrorCategory = Literal[
    "auth",
    "validation",
    "parse",
    "not_found",
    "programming",
    "timeout",
    "network",
    "rate_limit",
    "server",
]
CATEGORIES: Final[tuple[ErrorCategory, ...]] = get_args(ErrorCategory)
RETRYABLE: Final[frozenset[ErrorCategory]] = frozenset(
    {"timeout", "network", "rate_limit", "server"}
)
# An exception's qualified name; a longer one is a child's record gone wrong.
MAX_EXCEPTION_TYPE: Final = 200


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    """A classified failure: what the child writes and what events carry."""

    category: ErrorCategory
    retryable: bool
    message: str
    exception_type: str | None = None

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    def to_exception(self) -> TaskError:
        return TaskError(
            self.category,
            self.message,
            retryable=self.retryable,
            exception_type=self.exception_type,
        )


def info(category: ErrorCategory, message: str, exception_type: str | None = None) -> ErrorInfo:
    return ErrorInfo(
        category=category,
        retryable=category in RETRYABLE,
        message=sanitize_error_message(message),
        exception_type=exception_type,
    )


def classify_status(status: int) -> ErrorCategory:
    """Map an HTTP status (Anthropic API, AWS, anything REST) to a category."""
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status in (408, 504):
        return "timeout"
    if status in (429, 529):
        return "rate_limit"
    if status >= 500:
        return "server"
    if 400 <= status < 500:
        return "validation"
    raise ValueError(f"HTTP status {status} is not an error")


_NETWORK_ERRNOS: Final = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EPIPE,
        errno.ETIMEDOUT,
    }
)
_PROGRAMMING: Final = (
    TypeError,
    NameError,
    AttributeError,
    SyntaxError,
    IndexError,
    KeyError,
    AssertionError,
    RecursionError,
    ZeroDivisionError,
    NotImplementedError,
)
_TEXT_RULES: Final[tuple[tuple[re.Pattern[str], ErrorCategory], ...]] = (
    (re.compile(r"\b(401|403)\b|unauthori[sz]ed|forbidden|authentication|invalid api key", re.I), "auth"),
    (re.compile(r"\b429\b|\b529\b|rate.?limit|overloaded|too many requests|throttl", re.I), "rate_limit"),
    (re.compile(r"timed? ?out|timeout|deadline exceeded", re.I), "timeout"),
    (re.compile(r"econnrefused|econnreset|enotfound|connection (refused|reset|aborted)|name or service not known|network", re.I), "network"),
    (re.compile(r"\b5\d\d\b|internal server error|bad gateway|service unavailable", re.I), "server"),
    (re.compile(r"\b400\b|invalid request|validation", re.I), "validation"),
)  # fmt: skip


def classify_text(text: str) -> ErrorCategory | None:
    for pattern, category in _TEXT_RULES:
        if pattern.search(text):
            return category
    return None


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status_code", "status", "http_status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 400 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):  # botocore ClientError
        meta = response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode") if isinstance(meta, Mapping) else None
        if isinstance(status, int) and 400 <= status < 600:
            return status
    return None


def classify_exception(exc: BaseException) -> ErrorInfo:
    """Classify any exception; the most specific evidence wins."""
    kind = type(exc).__name__
    message = str(exc) or kind
    if isinstance(exc, TaskError):
        return info(cast(ErrorCategory, exc.category), exc.message, exc.exception_type or kind)
    if isinstance(exc, InvalidInput):
        return info("validation", message, kind)
    if isinstance(exc, json.JSONDecodeError):
        return info("parse", message, kind)
    if isinstance(exc, TimeoutError | socket.timeout) or kind in ("AbortError", "CancelledError"):
        return info("timeout", message, kind)
    if isinstance(exc, FileNotFoundError | ModuleNotFoundError) or kind == "NotFound":
        return info("not_found", message, kind)
    if isinstance(exc, ConnectionError) or (
        isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS
    ):
        return info("network", message, kind)
    if isinstance(exc, socket.gaierror):
        return info("network", message, kind)
    status = _status_of(exc)
    if status is not None:
        return info(classify_status(status), message, kind)
    if isinstance(exc, _PROGRAMMING):
        return info("programming", message, kind)
    if isinstance(exc, ValueError) and kind in ("ValidationError",):
        return info("validation", message, kind)
    by_text = classify_text(f"{kind}: {message}")
    if by_text is not None:
        return info(by_text, message, kind)
    if isinstance(exc, ValueError | UnicodeError):
        return info("validation", message, kind)
    # Unknown failures are not retried: retrying a bug burns attempts and money.
    return info("programming", message, kind)


def from_record(record: Mapping[str, Any]) -> ErrorInfo:
    """Read a child's structured error record; malformed records are parse errors."""
    category = record.get("category")
    message = str(record.get("message") or "no message")
    exception_type = record.get("exception_type")
    if category not in CATEGORIES:
        shown = sanitize_error_message(repr(category), limit=40)
        return info("parse", f"unreadable error record (category={shown}): {message}")
    retryable = bool(record.get("retryable", category in RETRYABLE))
    return ErrorInfo(
        category=cast(ErrorCategory, category),
        retryable=retryable and category in RETRYABLE,
        message=sanitize_error_message(message),
        # The child wrote it: bounded and scrubbed like the message.
        exception_type=(
            sanitize_error_message(str(exception_type), limit=MAX_EXCEPTION_TYPE)
            if exception_type
            else None
        ),
    )
