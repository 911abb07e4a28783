"""Keep secrets out of events, logs and error records; keep task input inside its template.

`sanitize_error_message` runs on every message that leaves a process (events, log
lines, error records). `sanitize_prompt_input` runs on every value placed into a
prompt template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final, TextIO

MAX_ERROR_MESSAGE: Final = 2_000
MAX_PROMPT_VALUE: Final = 100_000
REDACTED: Final = "[REDACTED]"

_REDACTIONS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # Anthropic / OpenAI-style keys and Slack tokens.
    (re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}"), "[REDACTED_API_KEY]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), "[REDACTED_API_KEY]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{8,}"), "[REDACTED_SLACK_TOKEN]"),
    # GitHub tokens (classic and fine-grained), GitLab and npm tokens.
    (re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), "[REDACTED_TOKEN]"),
    (re.compile(r"\b(glpat-[A-Za-z0-9_\-]{20,}|npm_[A-Za-z0-9]{30,})"), "[REDACTED_TOKEN]"),
    # AWS access key ids and secrets.
    (re.compile(r"\b(AKIA|ASIA|AROA|AIDA)[A-Z0-9]{16}\b"), "[REDACTED_AWS_KEY_ID]"),
    (
        re.compile(
            r"(?i)(aws_secret_access_key|aws_session_token|secret_?access_?key)"
            r"(\s*[=:]\s*)['\"]?[A-Za-z0-9/+=]{16,}['\"]?"
        ),
        r"\1\2[REDACTED]",
    ),
    # Bearer tokens and generic key=value secrets.
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._\-+/=]{8,}"), r"\1 [REDACTED]"),
    (
        re.compile(
            r"(?i)\b(api[_-]?key|token|password|passwd|secret|authorization|x-api-key)"
            r"(\"?\s*[=:]\s*\"?)[^\s\"',;]{4,}"
        ),
        r"\1\2[REDACTED]",
    ),
    # ARNs with a 12-digit account id keep their shape, not the account.
    (re.compile(r"(arn:aws[a-z\-]*:[a-z0-9\-]*:[a-z0-9\-]*:)\d{12}(:)"), r"\1[ACCOUNT]\2"),
    (re.compile(r"\b\d{12}\b(?=\.dkr\.ecr|:role/|:user/)"), "[ACCOUNT]"),
    # E-mail addresses.
    (re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}"), "[REDACTED_EMAIL]"),
    # Long opaque secrets (40-char AWS secrets, JWTs) standing alone. An AWS secret is
    # random base64: it has upper and lower case letters (all but one in 10^9 do). A run
    # of one case is an id, a hash or a path (`<request id>/attempt-1` is 40 characters),
    # and redacting it would cut the key out of an error's S3 path.
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"), "[REDACTED_JWT]"),
    (re.compile(
        r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])"
        r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
    ), "[REDACTED_SECRET]"),
)  # fmt: skip

_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A lone surrogate (JSON's "\ud800" decodes to one) is not text: no AWS call can carry it.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def sanitize_error_message(message: str, *, limit: int = MAX_ERROR_MESSAGE) -> str:
    """Strip credentials, account ids and e-mail addresses, control characters and lone
    surrogates; bound the length.

    The values of this process's secret-named variables (`remember_environment`) go
    first, whatever they look like.
    """
    text = _SURROGATE.sub("\ufffd", _CONTROL.sub("", redact_known(str(message))))
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    if len(text) > limit:
        text = text[: limit - 14] + " …[truncated]"
    return text


# A variable whose name has one of these words (between underscores) holds a secret:
# ANTHROPIC_API_KEY, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, SLACK_BOT_TOKEN,
# DB_PASSWORD, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (the way to the task role), ...
_SECRET_NAME: Final = re.compile(
    r"(?:^|_)(?:KEY|APIKEY|TOKEN|SECRET|SECRETS|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|"
    r"CREDENTIALS|AUTH|AUTHORIZATION|COOKIE|SESSION|PRIVATE|SIGNATURE|DSN)(?:_|$)",
    re.IGNORECASE,
)
# Shorter values ("1", "true", "dev") are settings, not secrets, and would redact noise.
MIN_SECRET_LENGTH: Final = 8
# Set once at start-up; read by every sanitizer (a list, replaced whole, never grown).
_known: list[str] = []


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """The values of the secret-named variables of `environ`, longest first."""
    found = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(found, key=len, reverse=True)


def remember_environment(environ: Mapping[str, str]) -> None:
    """From now on every sanitizer of this process removes these values (start-up)."""
    values = environment_secrets(environ)
    # As written inside a JSON string, too (a secret holding / or " or non-ASCII text).
    escaped = {json.dumps(v)[1:-1] for v in values} | {
        json.dumps(v, ensure_ascii=False)[1:-1] for v in values
    }
    _known[:] = sorted(set(values) | escaped, key=len, reverse=True)


def redact_known(text: str) -> str:
    """Remove the remembered secret values (see `remember_environment`)."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def known_secret_bytes() -> list[bytes]:
    """The remembered secret values as bytes, in the order `redact_known_bytes` removes
    them (worker/settle/scrub.py streams a file through the same replacements)."""
    return [secret.encode("utf-8", "replace") for secret in _known]


def redact_known_bytes(data: bytes) -> bytes:
    for raw in known_secret_bytes():
        if raw in data:
            data = data.replace(raw, REDACTED.encode())
    return data


class ScrubbingStream:
    """A text stream that removes the remembered secrets from everything written to it:
    the worker's log handler writes through it, whatever a record holds."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(redact_known(text))

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def redact_values(text: str, secrets: list[str]) -> str:
    """Remove known secret values (e.g. the configured API key) wherever they appear."""
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[REDACTED]")
    return text


# Bidirectional overrides and zero-width characters can hide text from a human reviewer
# of a prompt while the model still reads it.
_INVISIBLE: Final = re.compile(r"[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def sanitize_prompt_input(
    value: str,
    *,
    name: str = "input",
    limit: int = MAX_PROMPT_VALUE,
    delimiter: str = "input",
) -> str:
    """Make one input value safe to place between the template's delimiters.

    The template wraps each value as ``<input name="...">VALUE</input>``. A value that
    contains ``</input>`` (or forges a new ``<input ...>``) would close the data block and
    speak as the template's author, so every tag of the delimiter's name is defused into
    ``&lt;/input>``. Control and invisible characters go; newlines and tabs stay.
    A value over `limit` characters is rejected (`InvalidInput`), never silently cut.
    """
    from agentq.errors import InvalidInput  # errors imports nothing; keep this module leaf

    if not isinstance(value, str):
        raise InvalidInput(name, f"must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidInput(name, f"is {len(value)} characters; the limit is {limit}")
    text = value.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _INVISIBLE.sub("", text)
    tag = re.compile(rf"<(\s*/?\s*{re.escape(delimiter)})(?=[\s>/]|$)", re.IGNORECASE)
    return tag.sub(r"&lt;\1", text)
