"""What a request was scripted to do: the scenario model, shared by markers and scripts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

STRUCTURED_OUTPUT_TOOL: Final = "StructuredOutput"
MARKER_OPEN: Final = "[[model:"
MARKER_CLOSE: Final = "]]"
DEFAULT_KEY: Final = "default"
DEFAULT_MODEL: Final = "claude-offline"
SYSTEM_REMINDER: Final = "<system-reminder>"
SNIPPET_LEN: Final = 60
SSE_CHUNK: Final = 24
SCRIPTED_ID: Final = "toolu_offline_s"
# What the CLI puts in the transcript for a turn no model answered: resuming a session
# whose last message is the user's (tool results), it closes that turn with this text.
CLI_SYNTHETIC_ANSWER: Final = "No response requested."

ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
    529: "overloaded_error",
}

ERROR_MESSAGES: Final[Mapping[int, str]] = {
    401: "invalid x-api-key",
    429: "Number of request tokens has exceeded your per-minute rate limit (offline model server)",
    500: "Internal server error (offline model server)",
    529: "Overloaded (offline model server)",
}


class ScriptError(ValueError):
    """A marker or script file that does not follow the grammar."""


@dataclass(frozen=True)
class Failure:
    """Answer an HTTP error instead of a message."""

    status: int
    times: int | None = None  # None: every time
    turn: int | None = None
    retry_after: float | None = None
    no_retry: bool = False


@dataclass(frozen=True)
class Stall:
    """Hold the connection open without answering until the server stops."""

    midstream: bool = False
    times: int | None = None
    turn: int | None = None


@dataclass(frozen=True)
class Delay:
    """Wait before answering."""

    ms: int
    turn: int | None = None


@dataclass(frozen=True)
class ToolCall:
    """A tool call the fake model makes before its final answer."""

    name: str
    input: dict[str, Any]


_UNSET: Final[Any] = object()


@dataclass
class Scenario:
    """Everything a request was scripted to do. Built from markers and/or script rules."""

    key: str | None = None
    failures: list[Failure] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    delays: list[Delay] = field(default_factory=list)
    output: Any = _UNSET
    output_times: int | None = None
    tools: list[ToolCall] = field(default_factory=list)
    text: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    source: str = ""  # marker text the scenario came from (default key)

    @property
    def has_output(self) -> bool:
        return self.output is not _UNSET

    def merge(self, other: Scenario) -> Scenario:
        """Return a new scenario: ``self`` then ``other`` (``other`` wins for single values)."""
        return Scenario(
            key=other.key if other.key is not None else self.key,
            failures=[*self.failures, *other.failures],
            stalls=[*self.stalls, *other.stalls],
            delays=[*self.delays, *other.delays],
            output=other.output if other.has_output else self.output,
            output_times=other.output_times if other.has_output else self.output_times,
            tools=[*self.tools, *other.tools],
            text=other.text if other.text is not None else self.text,
            usage={**self.usage, **other.usage},
            source=other.source or self.source,
        )


@dataclass(frozen=True)
class Rule:
    """A script-file rule: a scenario applied to requests whose text contains ``match``."""

    scenario: Scenario
    key: str
    match: str | None = None

    def matches(self, text: str) -> bool:
        return self.match is None or self.match in text


@dataclass
class RequestRecord:
    """Summary of one received HTTP request (what tests inspect)."""

    index: int
    method: str
    path: str
    key: str | None = None
    attempt: int = 0
    turn: int = 0
    stream: bool = False
    model: str | None = None
    tool_names: list[str] = field(default_factory=list)
    prompt: str = ""
    latest_prompt: str = ""  # the latest user prompt (a follow-up's, in a continued session)
    status: int = 0  # 0 while stalled / never answered
    outcome: str = ""
    usage: dict[str, int] | None = None
    response_content: list[dict[str, Any]] = field(default_factory=list)
    retry_count: str | None = None  # the client's x-stainless-retry-count header
    user_agent: str | None = None
    auth: str = "none"  # "x-api-key", "bearer" or "none" (which credential the client sent)
    received_at: float = 0.0
