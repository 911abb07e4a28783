"""Claude Agent SDK failures → the agentq error taxonomy.

Three places report a failed run: an exception from `query()` (the CLI could not start,
died, or exited after an error result), an `AssistantMessage.error` (the CLI's label
for an API failure, e.g. ``rate_limit``), and a `ResultMessage` with ``is_error`` (its
``subtype`` and ``api_error_status`` say why). Each becomes an `ErrorInfo`; the most
specific evidence wins: an HTTP status, then the subtype, then the CLI's label, then text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from claude_agent_sdk import (
    ClaudeSDKError,
    CLIConnectionError,
    CLIJSONDecodeError,
    CLINotFoundError,
    ProcessError,
    ResultMessage,
)

from agentq.taxonomy import ErrorCategory, ErrorInfo, classify_exception, classify_status, info
from agentq.taxonomy import classify_text as _classify_text

try:  # ResultError arrived in newer SDKs; older ones raise a bare ProcessError.
    from claude_agent_sdk import ResultError
except ImportError:  # pragma: no cover - depends on the installed SDK
    ResultError = None  # type: ignore[assignment,misc]

# AssistantMessage.error labels the CLI puts on a synthetic "API Error" message.
ASSISTANT_ERRORS: Final[Mapping[str, ErrorCategory]] = {
    "authentication_failed": "auth",
    "billing_error": "auth",
    "permission_denied": "auth",
    "rate_limit": "rate_limit",
    "overloaded": "rate_limit",
    "invalid_request": "validation",
    "server_error": "server",
    "api_error": "server",
    "timeout": "timeout",
    "network_error": "network",
    "max_output_tokens": "parse",
    "unknown": "server",
}

# Limits the definition set are not transient: running again would hit them again.
RESULT_SUBTYPES: Final[Mapping[str, tuple[ErrorCategory, str]]] = {
    "error_max_turns": ("validation", "the agent used its max_turns without a result"),
    "error_max_budget_usd": ("validation", "the agent exceeded its max_budget_usd"),
    "error_max_structured_output_retries": (
        "parse",
        "the model's structured output did not match the output schema",
    ),
    "error_during_execution": ("server", "the agent run failed during execution"),
}


def classify_result(
    result: ResultMessage, assistant_error: str | None = None, *, refused_outputs: int = 0
) -> ErrorInfo:
    """Why an `is_error` result failed. `refused_outputs`: structured answers the model
    gave that the CLI refused; a run that then ran out of turns failed on the schema."""
    if result.subtype == "error_max_turns" and refused_outputs > 0:
        return info(
            "parse",
            f"the model's structured output did not match the output schema "
            f"({refused_outputs} answer(s) refused before max_turns ran out)",
            "ResultMessage",
        )
    return _classify_payload(
        subtype=result.subtype,
        status=getattr(result, "api_error_status", None),
        errors=list(getattr(result, "errors", None) or []),
        text=result.result,
        assistant_error=assistant_error,
        exception_type="ResultMessage",
    )


def classify_sdk_exception(exc: BaseException, assistant_error: str | None = None) -> ErrorInfo:
    """Classify anything `query()` raised (and the errors the child itself raises)."""
    kind = type(exc).__name__
    if ResultError is not None and isinstance(exc, ResultError):
        return _classify_payload(
            subtype=exc.subtype,
            status=exc.api_error_status,
            errors=exc.errors,
            text=exc.result,
            assistant_error=assistant_error,
            exception_type=kind,
        )
    if isinstance(exc, CLINotFoundError):
        return info("not_found", f"the Claude Code CLI was not found: {exc}", kind)
    if isinstance(exc, CLIJSONDecodeError):
        return info("parse", str(exc), kind)
    if isinstance(exc, ProcessError):
        labelled = ASSISTANT_ERRORS.get(assistant_error or "")
        if labelled is not None:
            return info(labelled, str(exc), kind)
        stderr = exc.stderr or ""
        by_text = _classify_text(stderr) if stderr else None
        # A CLI that died without saying why is treated as transient; the attempt
        # limit bounds what that costs.
        return info(by_text or "server", str(exc), kind)
    if isinstance(exc, CLIConnectionError):
        return info("network", f"lost the Claude Code CLI: {exc}", kind)
    if isinstance(exc, ClaudeSDKError):
        return info("server", str(exc), kind)
    return classify_exception(exc)


def _classify_payload(
    *,
    subtype: str | None,
    status: int | None,
    errors: list[str],
    text: str | None,
    assistant_error: str | None,
    exception_type: str,
) -> ErrorInfo:
    detail = "; ".join(e for e in [*errors, text or ""] if e) or "no detail"
    if isinstance(status, int) and 400 <= status < 600:
        return info(classify_status(status), f"model API error {status}: {detail}", exception_type)
    known = RESULT_SUBTYPES.get(subtype or "")
    if known is not None:
        category, meaning = known
        return info(category, f"{meaning} ({subtype}): {detail}", exception_type)
    labelled = ASSISTANT_ERRORS.get(assistant_error or "")
    if labelled is not None:
        return info(labelled, detail, exception_type)
    return info(
        _classify_text(detail) or "server", f"{subtype or 'error'}: {detail}", exception_type
    )
