"""Fault-injection settings, read from the environment in this one place.

They stay out of `agentq.config.Settings` on purpose: a production deployment never
sets them, and a fault spec is a test harness's business, not the worker's.

- `AGENTQ_FAULTS`: the spec. JSON (`{"rules": [{"op": ..., "kind": ..., "rate": ...}]}`)
  or the compact form `op=kind@rate;op=kind@rate` (e.g.
  `dynamodb:UpdateItem=applied_then_failed@0.05;*=throttle@0.05`).
- `AGENTQ_FAULTS_SEED`: an integer; the same seed replays the same decisions per
  (service, operation) call sequence.
- `AGENTQ_FAULTS_LOG`: a file that gets one JSON line per injected fault.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentq.errors import ConfigError
from agentq.faults import LOG_VAR, SEED_VAR, SPEC_VAR

_OP = re.compile(r"^(\*|[a-z0-9-]+:(\*|[A-Za-z0-9]+))$")
_COMPACT_RULE = re.compile(r"^(?P<op>[^=\s]+)=(?P<kind>[a-z_]+)@(?P<rate>[0-9.eE+-]+)$")


class Kind(StrEnum):
    """How a call fails. Each kind applies only to the operations where AWS does it."""

    THROTTLE = "throttle"
    SERVER_ERROR = "server_error"
    CONNECTION_RESET = "connection_reset"
    READ_TIMEOUT = "read_timeout"
    LATENCY = "latency"
    APPLIED_THEN_FAILED = "applied_then_failed"
    TRANSACTION_CONFLICT = "transaction_conflict"
    PARTIAL_BATCH = "partial_batch"


class FaultRule(BaseModel):
    """One rule: on calls to `op`, inject `kind` with probability `rate`.

    `op` is `service:Operation` (botocore's service name: dynamodb, sqs, events, s3),
    `service:*` or `*`; the wildcards leave control-plane calls (Create*, Describe*...)
    alone. `limit` caps injections per process, `match` restricts the rule to requests
    whose body contains that text (a table name, a condition, a task id).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str
    kind: Kind
    rate: float = Field(ge=0.0, le=1.0)
    limit: int | None = Field(default=None, ge=0)
    match: str | None = Field(default=None, min_length=1, max_length=512)
    delay: float = Field(default=0.2, ge=0.0, le=30.0)

    @field_validator("op")
    @classmethod
    def _valid_op(cls, value: str) -> str:
        if not _OP.match(value):
            raise ValueError("must be '*', 'service:*' or 'service:Operation'")
        return value

    def compact(self) -> str:
        return f"{self.op}={self.kind.value}@{self.rate!r}"


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[FaultRule, ...] = Field(max_length=64)


def parse_spec(text: str) -> FaultSpec:
    """A spec from JSON or the compact form; `ConfigError` names what is wrong."""
    stripped = text.strip()
    try:
        if stripped.startswith("{"):
            return FaultSpec.model_validate(json.loads(stripped))
        return FaultSpec(rules=tuple(_compact_rule(part) for part in _parts(stripped)))
    except (ValidationError, ValueError) as exc:
        raise ConfigError(SPEC_VAR, f"is not a valid fault spec: {_short(exc)}") from None


def _parts(text: str) -> list[str]:
    return [part.strip() for part in re.split(r"[;,]", text) if part.strip()]


def _compact_rule(part: str) -> FaultRule:
    found = _COMPACT_RULE.match(part)
    if found is None:
        raise ValueError(f"rule {part[:60]!r} is not op=kind@rate")
    return FaultRule(op=found["op"], kind=Kind(found["kind"]), rate=float(found["rate"]))


def _short(exc: Exception) -> str:
    message = str(exc).replace("\n", " ")
    return message if len(message) <= 300 else message[:297] + "..."


@dataclass(frozen=True)
class FaultSettings:
    spec: FaultSpec
    seed: int
    log_path: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultSettings | None:
        """The settings, or None when `AGENTQ_FAULTS` is unset or empty (no faults)."""
        env = os.environ if environ is None else environ
        text = env.get(SPEC_VAR, "").strip()
        if not text:
            return None
        seed_text = env.get(SEED_VAR, "").strip()
        try:
            seed = int(seed_text) if seed_text else secrets.randbits(32)
        except ValueError:
            raise ConfigError(SEED_VAR, "must be an integer") from None
        return cls(spec=parse_spec(text), seed=seed, log_path=env.get(LOG_VAR) or None)
