"""The few settings read where the settings model would cost more than the work.

A task child runs once per task, so whatever it imports is on every task's latency:
pydantic and the settings model (~100 ms of a cold child) would double its start. It
reads its two settings here instead, and every process reads the test clock offset
here (`agentq.events.now_ms` is imported by the Lambdas, which load the model only on
their first invocation).

`agentq.config.Settings` stays the one documentation source: each field below is the
model field of the same name, with the same variable, default and range, and fails
with the same words (tests/unit/test_config_light.py holds them equal, against random
values too). Add a field here only for a process that must not import the model.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from agentq.errors import ConfigError

DAY_MS: Final = 86_400_000
# The default model of agent tasks; the settings model (config_worker) takes it from here.
DEFAULT_MODEL: Final = "claude-sonnet-4-5"
# What pydantic's lax int accepts from a string once agentq's validator has stripped it:
# a sign, ASCII digits with single underscores between them, a fraction of zeros ("5.0").
# pydantic's integers: digits with single underscores between them, after any run of
# zeros and underscores that starts with a zero ("0__1" is 1, "1__0" is refused).
_INTEGER: Final = re.compile(r"(?P<sign>[+-]?)(?P<digits>(?:0[0_]*)?[0-9]+(?:_[0-9]+)*)(?:\.0+)?")


@dataclass(frozen=True)
class IntVar:
    """An integer setting: its variable, default and inclusive range."""

    env: str
    default: int
    ge: int
    le: int

    def read(self, environ: Mapping[str, str]) -> int:
        raw = environ.get(self.env)
        if raw is None:
            return self.default
        found = _INTEGER.fullmatch(raw.strip())
        if found:
            # Leading zeros go first: int() refuses over 4,300 digits, pydantic does not.
            digits = found["digits"].replace("_", "").lstrip("0") or "0"
            if len(digits) <= len(str(max(abs(self.ge), abs(self.le)))):
                value = int(found["sign"] + digits)
                if self.ge <= value <= self.le:
                    return value
        raise ConfigError(self.env, f"expected an integer from {self.ge} to {self.le}, got {raw!r}")


@dataclass(frozen=True)
class TextVar:
    """A text setting: its variable, default and length range (characters)."""

    env: str
    default: str
    min_length: int
    max_length: int

    def read(self, environ: Mapping[str, str]) -> str:
        raw = environ.get(self.env)
        if raw is None:
            return self.default
        if self.min_length <= len(raw) <= self.max_length:
            return raw
        raise ConfigError(
            self.env,
            f"expected {self.min_length} to {self.max_length} characters, got {raw!r}",
        )


# The fields of `Settings` whose readers include the task child.
CHILD_FIELDS: Final[Mapping[str, IntVar | TextVar]] = {
    "model": TextVar("CLAUDE_MODEL", DEFAULT_MODEL, 1, 256),
    "step_timeout_ms": IntVar("DEFAULT_TIMEOUT", 300_000, 1, DAY_MS),
}


# The stage's variable: a Lambda names its metrics' stage dimension at import.
STAGE_VARIABLE: Final = "AGENTQ_STAGE"


class ChildDefaults(Protocol):
    """What the agent kind takes from the settings: `Settings` and `ChildSettings` both."""

    @property
    def model(self) -> str: ...

    @property
    def step_timeout_ms(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class ChildSettings:
    """The task child's settings, from its (allowlisted) environment."""

    model: str
    step_timeout_ms: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChildSettings:
        env = os.environ if environ is None else environ
        model = CHILD_FIELDS["model"].read(env)
        step = CHILD_FIELDS["step_timeout_ms"].read(env)
        assert isinstance(model, str) and isinstance(step, int)
        return cls(model=model, step_timeout_ms=step)


@functools.cache
def clock_offset_ms() -> int:
    """AGENTQ_TEST_CLOCK_OFFSET_MS, read once per process (`now_ms` is a hot path)."""
    raw = os.environ.get("AGENTQ_TEST_CLOCK_OFFSET_MS", "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            "AGENTQ_TEST_CLOCK_OFFSET_MS", f"expected an integer, got {raw!r}"
        ) from None
