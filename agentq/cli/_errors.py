"""Turning whatever a command raised into one line a newcomer can act on.

Every failure ends as `agentq: <what happened> — <what to do>` on stderr and, for
`--json` commands, one `{"error": {...}}` object on stdout, with a documented exit
code (agentq.cli.common). A traceback only appears with `--debug`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

from agentq.cli.common import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
)
from agentq.errors import ConfigError, InvalidInput, NotFound
from agentq.security import sanitize_error_message

LOCAL_HINT: Final = (
    "start the local stack with `agentq local up` and `source .agentq/local.env` in this "
    "shell (or add `--local`); for a deployed stage run `agentq env --stage NAME`"
)
_MISSING_RESOURCE: Final = frozenset(
    {
        "ResourceNotFoundException",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "NoSuchBucket",
    }
)
_CREDENTIALS_REFUSED: Final = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
    }
)
_THROTTLED: Final = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "RequestThrottled",
        "SlowDown",
    }
)


@dataclass(frozen=True)
class Failure:
    code: int
    kind: str
    message: str
    hint: str = ""

    def line(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "kind": self.kind, "message": self.message,
                          "hint": self.hint}}  # fmt: skip


def endpoint_for(service: str | None = None) -> str:
    """Where boto3 sends this process's calls, as the user configured it."""
    if service:
        specific = os.environ.get(f"AWS_ENDPOINT_URL_{service.upper()}")
        if specific:
            return specific
    base = os.environ.get("AWS_ENDPOINT_URL")
    if base:
        return base
    # The region the command's clients used (agentq.config falls back like boto3 does,
    # then to its default), never a guess: the user needs it to fix the call.
    from agentq.config.settings import _fallback_region

    region = os.environ.get("AWS_REGION") or _fallback_region(os.environ)
    return f"AWS region {region}"


def _is_local(endpoint: str) -> bool:
    return "127.0.0.1" in endpoint or "localhost" in endpoint


def _one_line(text: object) -> str:
    return " ".join(sanitize_error_message(str(text), limit=400).split())


def describe(exc: BaseException) -> Failure:
    """The failure a user sees for `exc` (anything a command may raise)."""
    if isinstance(exc, ConfigError):
        # A missing variable means this shell was never pointed at a stack; a bad value
        # is a typo to fix where it was set.
        if exc.variable.startswith(("--local", "env file")):
            hint = ""  # the message already says what to do
        elif exc.problem.startswith("is required"):
            hint = LOCAL_HINT
        else:
            hint = "see docs/configuration.md for its meaning and range"
        return Failure(EXIT_CONFIG, "config", _one_line(exc), hint)
    if isinstance(exc, NotFound):
        return Failure(EXIT_NOT_FOUND, "not_found", _one_line(exc), _not_found_hint(exc))
    if isinstance(exc, InvalidInput):
        return Failure(EXIT_INVALID, "invalid", _one_line(exc), _invalid_hint(exc))
    botocore_failure = _describe_botocore(exc)
    if botocore_failure is not None:
        return botocore_failure
    return Failure(
        EXIT_ERROR,
        "error",
        f"unexpected {type(exc).__name__}: {_one_line(exc)}",
        "run again with `agentq --debug ...` for the traceback",
    )


def _invalid_hint(exc: InvalidInput) -> str:
    # Most problems name the field and what it must be; these two need a command to fix.
    if exc.problem.startswith("unknown task definition"):
        return "`agentq definitions list` names the definitions this stage has"
    if exc.problem.startswith("is required by the prompt of"):
        return "add it to --input; `agentq definitions show NAME` shows the prompt"
    return ""


def _not_found_hint(exc: NotFound) -> str:
    if exc.kind in ("task", "job"):
        tenant = os.environ.get("TENANT_ID") or "default"
        return (
            f"looked under tenant {tenant!r}; work submitted through the producer API lives "
            "under the tenant its caller's IAM principal is mapped to (`agentq tenants "
            "list`): pass --tenant TENANT or set TENANT_ID"
        )
    if exc.kind == "task result":
        return "the task has no stored result (it may not have completed)"
    return ""


def _describe_botocore(exc: BaseException) -> Failure | None:
    from botocore import exceptions as bx

    if isinstance(exc, bx.ConnectionError | bx.HTTPClientError):
        endpoint = str(getattr(exc, "kwargs", {}).get("endpoint_url") or endpoint_for())
        if _is_local(endpoint):
            what, hint = "is the local stack running?", LOCAL_HINT
        else:
            what, hint = "network or region problem?", "check AWS_REGION and the network"
        return Failure(EXIT_UNREACHABLE, "unreachable",
                       f"cannot reach AWS at {endpoint} ({what})", hint)  # fmt: skip
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return Failure(
            EXIT_CONFIG,
            "credentials",
            f"no AWS credentials for {endpoint_for()}",
            "configure AWS credentials (AWS_PROFILE, or `aws configure`); locally: " + LOCAL_HINT,
        )
    if isinstance(exc, bx.NoRegionError | bx.ProfileNotFound):
        return Failure(EXIT_CONFIG, "config", _one_line(exc), "set AWS_REGION or AWS_PROFILE")
    if isinstance(exc, bx.ClientError):
        return _describe_client_error(exc)
    return None


def _describe_client_error(exc: Any) -> Failure:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", "?"))
    operation = getattr(exc, "operation_name", "?")
    detail = f"{code} in {operation}: {_one_line(error.get('Message', ''))}"
    endpoint = endpoint_for()
    if code in _MISSING_RESOURCE:
        hint = (
            "the env file may be from a local stack that has stopped: restart `agentq local "
            "up` and source its env file again"
            if _is_local(endpoint)
            else "check the stage's variables (`agentq env --stage NAME`) and AWS_REGION"
        )
        return Failure(
            EXIT_UNREACHABLE, "missing_resource", f"{endpoint} has no such resource ({detail})",
            hint,
        )  # fmt: skip
    if code in _CREDENTIALS_REFUSED:
        return Failure(EXIT_CONFIG, "credentials", f"{endpoint} refused the credentials "
                       f"({detail})", "check AWS_PROFILE and the role's permissions")  # fmt: skip
    if code in _THROTTLED:
        return Failure(EXIT_ERROR, "throttled", f"{endpoint} is throttling ({detail})",
                       "try again in a few seconds")  # fmt: skip
    return Failure(EXIT_ERROR, "aws", f"{endpoint}: {detail}")
