"""Offline stand-in for the Anthropic Messages API (a development fake, like moto; not a model).

The Claude Code CLI that ships inside ``claude-agent-sdk`` honours ``ANTHROPIC_BASE_URL``.
Pointed at this server it runs complete agent sessions with no network: every answer is
computed deterministically from the request. See ``docs/model-server.md`` for the long form.

Endpoints
---------
``POST /v1/messages``
    Streaming (SSE) when the body has ``"stream": true``, plain JSON otherwise.
``POST /v1/messages/count_tokens``
    ``{"input_tokens": <len(body) // 4>}``.
``GET /v1/models``, ``GET /``, ``GET /health``, ``HEAD *``
    Small sensible answers for probes. Anything else: 404 with the Anthropic error shape.

Default behaviour (no script)
-----------------------------
* If the request offers a ``StructuredOutput`` tool (what the CLI does for
  ``output_format={"type": "json_schema", ...}``) and the conversation has no accepted
  ``StructuredOutput`` call yet, the answer is a ``tool_use`` of ``StructuredOutput`` whose input
  is generated from the tool's ``input_schema`` by :func:`generate_value` (schema-valid,
  deterministic, strings mention the prompt). Once its ``tool_result`` came back without
  ``is_error``, the answer is a short final text (``end_turn``).
* Without ``StructuredOutput`` the answer is a deterministic text (``end_turn``).
* Usage (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``) is derived from the request size, see :func:`compute_usage`.
  Each request's numbers are kept in :attr:`ModelServer.request_log`.

Scenario grammar (markers in the prompt)
----------------------------------------
Markers may appear in any user text block or in the system prompt::

    [[model: DIRECTIVE; DIRECTIVE; ...]]

Several markers in one prompt add up. Directives (``N`` is an integer)::

    key NAME                       scenario key for counting (default: the marker text itself)
    fail STATUS [xN] [turn N] [retry-after SECONDS] [no-retry]
                                   answer HTTP STATUS (e.g. 401, 429, 500, 529) with the Anthropic
                                   error body. ``xN``: only the first N requests of this scenario key
                                   (counted server-wide, so across CLI processes); without ``xN``
                                   every time. Several ``fail`` directives are used in order
                                   (``fail 429 x1; fail 529 x1`` = 429, then 529, then success).
                                   ``turn N``: only requests whose conversation already has N
                                   assistant turns (counted per key and turn). ``retry-after``
                                   sets that header; ``no-retry`` sends ``x-should-retry: false``.
    stall [midstream] [xN] [turn N]
                                   hold the connection without answering until the server stops
                                   (``midstream``: after sending ``message_start``).
    delay MS[ms|s] [turn N]        wait before answering (interrupted by server stop).
    output JSON [xN]               StructuredOutput input to send instead of the generated one
                                   (may violate the schema). ``xN``: only for the first N
                                   StructuredOutput calls of the conversation.
    tool NAME JSON                 call tool NAME with input JSON before the final answer; several
                                   ``tool`` directives are called one per turn, in order.
    text TEXT                      final text (bare words up to ``;`` or a JSON string).
    usage input=N output=N cache_read=N cache_creation=N
                                   fixed usage numbers instead of the derived ones.

Example: ``Summarise the file [[model: key retry-demo; fail 429 x2; tool Bash {"command": "ls"}]]``.

Script file (``--script FILE`` or ``ModelServer(script=...)``)
--------------------------------------------------------------
JSON or YAML: ``{"rules": [RULE, ...]}`` or a bare list of rules. The first rule whose ``match``
(a substring of the prompt/system text; omitted = every request) matches applies; markers in the
prompt are added on top of it (a marker ``key`` wins). A rule has ``match``, ``key`` (default:
``match``, else ``rule<index>``), ``do`` (a directive string in the grammar above) and/or the
structured fields ``fail`` (mapping or list of mappings: ``status``, ``times``, ``turn``,
``retry_after``, ``no_retry``), ``stall`` (true or ``"midstream"``), ``delay_ms``, ``output``,
``output_times``, ``tools`` (list of ``{name, input}``), ``text``, ``usage`` (mapping with
``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``).

Run: ``python -m agentq.local.model_server --port 0 [--script FILE]`` prints the URL and serves
until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import math
import re
import signal
import socket
import sys
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final, cast
from urllib.parse import urlsplit

__all__ = [
    "STRUCTURED_OUTPUT_TOOL",
    "Failure",
    "ModelServer",
    "RequestRecord",
    "Rule",
    "Scenario",
    "ScriptError",
    "ToolCall",
    "compute_usage",
    "generate_value",
    "load_script",
    "main",
    "parse_directives",
    "parse_markers",
]

STRUCTURED_OUTPUT_TOOL: Final = "StructuredOutput"
MARKER_OPEN: Final = "[[model:"
MARKER_CLOSE: Final = "]]"
DEFAULT_KEY: Final = "default"
DEFAULT_MODEL: Final = "claude-offline"
_SYSTEM_REMINDER: Final = "<system-reminder>"
_SNIPPET_LEN: Final = 60
_SSE_CHUNK: Final = 24
_SCRIPTED_ID: Final = "toolu_offline_s"

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

_ERROR_MESSAGES: Final[Mapping[int, str]] = {
    401: "invalid x-api-key",
    429: "Number of request tokens has exceeded your per-minute rate limit (offline model server)",
    500: "Internal server error (offline model server)",
    529: "Overloaded (offline model server)",
}


class ScriptError(ValueError):
    """A marker or script file that does not follow the grammar."""


# --------------------------------------------------------------------------------------------
# Scenario model
# --------------------------------------------------------------------------------------------


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
    status: int = 0  # 0 while stalled / never answered
    outcome: str = ""
    usage: dict[str, int] | None = None
    response_content: list[dict[str, Any]] = field(default_factory=list)
    retry_count: str | None = None  # the client's x-stainless-retry-count header
    user_agent: str | None = None
    auth: str = "none"  # "x-api-key", "bearer" or "none" (which credential the client sent)
    received_at: float = 0.0


# --------------------------------------------------------------------------------------------
# Grammar
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    raw: str
    value: Any
    is_json: bool


_DECODER: Final = json.JSONDecoder()
_WORD_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_USAGE_NAMES: Final[Mapping[str, str]] = {
    "input": "input_tokens",
    "input_tokens": "input_tokens",
    "output": "output_tokens",
    "output_tokens": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_read_input_tokens": "cache_read_input_tokens",
    "cache_creation": "cache_creation_input_tokens",
    "cache_creation_input_tokens": "cache_creation_input_tokens",
}


def _at_end(text: str, i: int, *, in_marker: bool) -> bool:
    return i >= len(text) or (in_marker and text.startswith(MARKER_CLOSE, i))


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _scan(text: str, start: int, *, in_marker: bool) -> tuple[list[tuple[str, list[_Token]]], int]:
    """Scan ``VERB ARGS (; VERB ARGS)*`` from ``start``; return directives and end index.

    In a marker the scan stops at ``]]`` (outside JSON values) and the returned index is just
    past it; otherwise it runs to the end of ``text``.
    """
    directives: list[tuple[str, list[_Token]]] = []
    i = start
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            if in_marker:
                raise ScriptError(f"unterminated marker starting at {start}: missing ']]'")
            return directives, i
        if in_marker and text.startswith(MARKER_CLOSE, i):
            return directives, i + len(MARKER_CLOSE)
        if text[i] == ";":
            i += 1
            continue
        m = _WORD_RE.match(text, i)
        if m is None:
            raise ScriptError(f"expected a directive name at {text[i : i + 20]!r}")
        verb = m.group(0).lower()
        i = m.end()
        args: list[_Token] = []
        while True:
            i = _skip_ws(text, i)
            if _at_end(text, i, in_marker=in_marker) or text[i] == ";":
                break
            if text[i] in '{["':
                try:
                    value, end = _DECODER.raw_decode(text, i)
                except json.JSONDecodeError as exc:
                    raise ScriptError(f"bad JSON in directive {verb!r}: {exc}") from exc
                args.append(_Token(text[i:end], value, True))
                i = end
                continue
            j = i
            while (
                j < len(text)
                and not text[j].isspace()
                and text[j] != ";"
                and not (in_marker and text.startswith(MARKER_CLOSE, j))
            ):
                j += 1
            args.append(_Token(text[i:j], text[i:j], False))
            i = j
        directives.append((verb, args))


def _int(tok: _Token, what: str) -> int:
    try:
        return int(str(tok.value))
    except ValueError as exc:
        raise ScriptError(f"{what}: expected an integer, got {tok.raw!r}") from exc


def _qualifiers(verb: str, args: list[_Token], allowed: set[str]) -> dict[str, Any]:
    """Parse ``xN`` / ``times N`` / ``turn N`` / ``retry-after S`` / flags."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        word = str(tok.value).lower() if not tok.is_json else ""
        if re.fullmatch(r"x\d+", word) and "times" in allowed:
            out["times"] = int(word[1:])
        elif word in ("x", "times") and "times" in allowed and i + 1 < len(args):
            out["times"] = _int(args[i + 1], f"{verb} {word}")
            i += 1
        elif word == "turn" and "turn" in allowed and i + 1 < len(args):
            out["turn"] = _int(args[i + 1], f"{verb} turn")
            i += 1
        elif word == "retry-after" and "retry_after" in allowed and i + 1 < len(args):
            try:
                out["retry_after"] = float(str(args[i + 1].value))
            except ValueError as exc:
                raise ScriptError(f"{verb} retry-after: bad number {args[i + 1].raw!r}") from exc
            i += 1
        elif word in allowed and word not in ("times", "turn", "retry_after"):
            out[word.replace("-", "_")] = True
        else:
            raise ScriptError(f"unexpected argument {tok.raw!r} for {verb!r}")
        i += 1
    return out


def _apply(scn: Scenario, verb: str, args: list[_Token]) -> None:
    if verb == "key":
        if len(args) != 1:
            raise ScriptError("key takes exactly one name")
        scn.key = str(args[0].value)
    elif verb == "fail":
        if not args:
            raise ScriptError("fail needs an HTTP status")
        status = _int(args[0], "fail")
        q = _qualifiers("fail", args[1:], {"times", "turn", "retry_after", "no-retry"})
        scn.failures.append(
            Failure(
                status=status,
                times=q.get("times"),
                turn=q.get("turn"),
                retry_after=q.get("retry_after"),
                no_retry=bool(q.get("no_retry", False)),
            )
        )
    elif verb == "stall":
        q = _qualifiers("stall", args, {"times", "turn", "midstream"})
        scn.stalls.append(
            Stall(midstream=bool(q.get("midstream")), times=q.get("times"), turn=q.get("turn"))
        )
    elif verb == "delay":
        if not args:
            raise ScriptError("delay needs a duration, e.g. 'delay 250ms'")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)?", str(args[0].value))
        if m is None:
            raise ScriptError(f"delay: bad duration {args[0].raw!r}")
        ms = float(m.group(1)) * (1000 if m.group(2) == "s" else 1)
        q = _qualifiers("delay", args[1:], {"turn"})
        scn.delays.append(Delay(ms=int(ms), turn=q.get("turn")))
    elif verb == "output":
        if not args or not args[0].is_json:
            raise ScriptError("output needs a JSON value")
        scn.output = args[0].value
        scn.output_times = _qualifiers("output", args[1:], {"times"}).get("times")
    elif verb == "tool":
        if len(args) != 2 or args[0].is_json or not isinstance(args[1].value, dict):
            raise ScriptError('tool needs a name and a JSON object: tool Bash {"command": "ls"}')
        scn.tools.append(ToolCall(str(args[0].value), cast(dict[str, Any], args[1].value)))
    elif verb == "text":
        if len(args) == 1 and args[0].is_json:
            if not isinstance(args[0].value, str):
                raise ScriptError("text takes bare words or a JSON string")
            scn.text = args[0].value
        else:
            scn.text = " ".join(t.raw for t in args)
    elif verb == "usage":
        for tok in args:
            name, sep, num = str(tok.value).partition("=")
            if not sep or name not in _USAGE_NAMES:
                raise ScriptError(f"usage: expected NAME=INT (input/output/...), got {tok.raw!r}")
            try:
                scn.usage[_USAGE_NAMES[name]] = int(num)
            except ValueError as exc:
                raise ScriptError(f"usage: bad integer in {tok.raw!r}") from exc
    else:
        raise ScriptError(f"unknown directive {verb!r}")


def parse_directives(text: str) -> Scenario:
    """Parse a directive list (the body of a marker, or a rule's ``do``) into a scenario."""
    directives, _ = _scan(text, 0, in_marker=False)
    scn = Scenario()
    for verb, args in directives:
        _apply(scn, verb, args)
    return scn


def parse_markers(text: str) -> tuple[Scenario | None, str]:
    """Find every ``[[model: ...]]`` marker in ``text``.

    Returns the combined scenario (``None`` if there is no marker; ``source`` holds the
    markers' normalised text, the default scenario key) and ``text`` with the markers removed.
    """
    scn: Scenario | None = None
    bodies: list[str] = []
    kept: list[str] = []
    pos = 0
    while (start := text.find(MARKER_OPEN, pos)) != -1:
        kept.append(text[pos:start])
        body_start = start + len(MARKER_OPEN)
        directives, end = _scan(text, body_start, in_marker=True)
        bodies.append(" ".join(text[body_start : end - len(MARKER_CLOSE)].split()))
        part = Scenario()
        for verb, args in directives:
            _apply(part, verb, args)
        scn = part if scn is None else scn.merge(part)
        pos = end
    kept.append(text[pos:])
    if scn is not None:
        scn.source = " | ".join(bodies)
    return scn, "".join(kept)


def _rule_from_mapping(raw: Mapping[str, Any], index: int) -> Rule:
    known = {
        "match",
        "key",
        "do",
        "fail",
        "stall",
        "delay_ms",
        "output",
        "output_times",
        "tools",
        "text",
        "usage",
    }
    unknown = set(raw) - known
    if unknown:
        raise ScriptError(f"rule {index}: unknown field(s) {sorted(unknown)}")
    scn = parse_directives(str(raw["do"])) if raw.get("do") else Scenario()
    fails = raw.get("fail")
    if fails is not None:
        for f in [fails] if isinstance(fails, Mapping) else list(fails):
            if not isinstance(f, Mapping) or "status" not in f:
                raise ScriptError(f"rule {index}: fail needs a mapping with 'status'")
            ra = f.get("retry_after")
            scn.failures.append(
                Failure(
                    status=int(f["status"]),
                    times=None if f.get("times") is None else int(f["times"]),
                    turn=None if f.get("turn") is None else int(f["turn"]),
                    retry_after=None if ra is None else float(ra),
                    no_retry=bool(f.get("no_retry", False)),
                )
            )
    stall = raw.get("stall")
    if stall:
        scn.stalls.append(Stall(midstream=stall == "midstream"))
    if raw.get("delay_ms") is not None:
        scn.delays.append(Delay(ms=int(raw["delay_ms"])))
    if "output" in raw:
        scn.output = raw["output"]
        scn.output_times = None if raw.get("output_times") is None else int(raw["output_times"])
    for t in raw.get("tools") or []:
        if not isinstance(t, Mapping) or not isinstance(t.get("input", {}), Mapping):
            raise ScriptError(f"rule {index}: tools entries need 'name' and an 'input' mapping")
        scn.tools.append(ToolCall(str(t["name"]), dict(t.get("input", {}))))
    if raw.get("text") is not None:
        scn.text = str(raw["text"])
    for name, value in dict(raw.get("usage") or {}).items():
        if name not in _USAGE_NAMES:
            raise ScriptError(f"rule {index}: unknown usage field {name!r}")
        scn.usage[_USAGE_NAMES[name]] = int(value)
    match = None if raw.get("match") is None else str(raw["match"])
    key = str(raw.get("key") or scn.key or match or f"rule{index}")
    scn.key = key
    return Rule(scenario=scn, key=key, match=match)


def load_script(source: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[Rule]:
    """Load rules from a JSON/YAML file path, or from already-parsed data."""
    data: Any
    if isinstance(source, str | Path):
        path = Path(source)
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml  # optional: only needed for YAML scripts

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    else:
        data = source
    if isinstance(data, Mapping):
        data = data.get("rules", [])
    if not isinstance(data, Sequence) or isinstance(data, str):
        raise ScriptError("a script is a list of rules or a mapping with 'rules'")
    rules: list[Rule] = []
    for i, raw in enumerate(data):
        if not isinstance(raw, Mapping):
            raise ScriptError(f"rule {i} is not a mapping")
        rules.append(_rule_from_mapping(raw, i))
    return rules


# --------------------------------------------------------------------------------------------
# Deterministic values from a JSON schema
# --------------------------------------------------------------------------------------------


def _h(*parts: object) -> int:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()
    return int(digest[:12], 16)


def _snippet(prompt: str) -> str:
    words = " ".join(prompt.split())
    if not words:
        return "offline"
    if len(words) <= _SNIPPET_LEN:
        return words
    cut = words[:_SNIPPET_LEN]
    return cut.rsplit(" ", 1)[0] if " " in cut else cut


def _resolve_ref(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref are supported, got {ref!r}")
    node = root
    for raw in ref[1:].split("/"):
        if not raw:
            continue
        part = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _merge_all_of(schema: Mapping[str, Any], root: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for raw in schema["allOf"]:
        part: Any = raw
        if isinstance(part, Mapping) and "$ref" in part:
            part = _resolve_ref(str(part["$ref"]), root)
        if not isinstance(part, Mapping):
            continue
        if "allOf" in part:
            part = _merge_all_of(part, root)
        for k, v in part.items():
            if k == "properties":
                merged["properties"] = {**merged.get("properties", {}), **v}
            elif k == "required":
                merged["required"] = sorted({*merged.get("required", []), *v})
            elif k in ("minimum", "minLength", "minItems", "exclusiveMinimum"):
                merged[k] = max(merged.get(k, v), v)
            elif k in ("maximum", "maxLength", "maxItems", "exclusiveMaximum"):
                merged[k] = min(merged.get(k, v), v)
            else:
                merged.setdefault(k, v)
    return merged


_FORMATS: Final[Mapping[str, str]] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "offline@example.com",
    "idn-email": "offline@example.com",
    "hostname": "offline.example.com",
    "idn-hostname": "offline.example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "duration": "PT1M",
}


def _pattern_sample(pattern: str, seed: int) -> str | None:
    """Build one string matching ``pattern`` from the parsed regex (best effort)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import sre_constants as c
        import sre_parse

    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None

    def category(cat: object) -> str:
        name = str(cat).lower()
        if "not" in name:
            return "-"
        if "digit" in name:
            return "7"
        if "space" in name:
            return " "
        return "a"  # word

    def emit(items: Any, depth: int = 0) -> str:
        out: list[str] = []
        if depth > 50:
            raise ValueError("pattern too deep")
        for op, av in items:
            if op is c.LITERAL:
                out.append(chr(av))
            elif op is c.NOT_LITERAL:
                out.append("a" if chr(av) != "a" else "b")
            elif op is c.ANY:
                out.append("x")
            elif op is c.IN:
                out.append(in_class(av))
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
                lo, _hi, sub = av
                out.append(emit(sub, depth + 1) * max(lo, 0))
            elif op is c.SUBPATTERN:
                out.append(emit(av[-1], depth + 1))
            elif op is getattr(c, "ATOMIC_GROUP", None):
                out.append(emit(av, depth + 1))
            elif op is c.BRANCH:
                branches = av[1]
                out.append(emit(branches[seed % len(branches)], depth + 1))
            elif op is c.CATEGORY:
                out.append(category(av))
            elif op in (c.AT, c.ASSERT, c.ASSERT_NOT, c.GROUPREF):
                continue
            else:
                raise ValueError(f"unsupported regex op {op}")
        return "".join(out)

    def in_class(items: Any) -> str:
        negate = any(op is c.NEGATE for op, _ in items)
        chars: list[str] = []
        for op, av in items:
            if op is c.LITERAL:
                chars.append(chr(av))
            elif op is c.RANGE:
                chars.append(chr(av[0]))
            elif op is c.CATEGORY:
                chars.append(category(av))
        if negate:
            for cand in "aZ0_-x":
                if cand not in chars:
                    return cand
            return "~"
        return chars[seed % len(chars)] if chars else "a"

    try:
        candidate = emit(parsed)
    except (ValueError, TypeError, IndexError):
        return None
    return candidate if re.search(pattern, candidate) else None


def _gen_string(schema: Mapping[str, Any], label: str, snippet: str, seed: int) -> str:
    fmt = schema.get("format")
    min_len = int(schema.get("minLength", 0))
    max_len = schema.get("maxLength")
    pattern = schema.get("pattern")
    if fmt in _FORMATS:
        return _FORMATS[str(fmt)]
    slug = re.sub(r"[^a-z0-9]+", "-", snippet.lower()).strip("-") or "offline"
    if fmt in ("uri", "url", "iri", "uri-reference", "iri-reference"):
        return f"https://example.com/{slug[:40]}"
    if fmt == "uuid":
        return str(uuid.UUID(int=_h(seed, label) << 80 | _h(label, seed)))
    base = f"{label}: {snippet}" if label else snippet
    if pattern is not None:
        pat = str(pattern)
        for cand in (base, snippet, slug, label):
            if cand and re.search(pat, cand):
                base = cand
                break
        else:
            sample = _pattern_sample(pat, seed)
            if sample is not None:
                return sample
    if max_len is not None and len(base) > int(max_len):
        base = base[: int(max_len)].rstrip() or base[: int(max_len)]
    if len(base) < min_len:
        filler = f" {snippet}" if snippet else " x"
        while len(base) < min_len:
            base += filler
        if max_len is not None:
            base = base[: max(min_len, min(len(base), int(max_len)))]
    return base


def _gen_number(schema: Mapping[str, Any], integer: bool, seed: int) -> int | float:
    lo: float | None = schema.get("minimum")
    hi: float | None = schema.get("maximum")
    ex_lo = schema.get("exclusiveMinimum")
    ex_hi = schema.get("exclusiveMaximum")
    step = 1 if integer else 0.01
    # draft 4 uses booleans; later drafts use numbers.
    if isinstance(ex_lo, bool):
        if ex_lo and lo is not None:
            lo = lo + step
    elif ex_lo is not None:
        lo = max(lo, ex_lo + step) if lo is not None else ex_lo + step
    if isinstance(ex_hi, bool):
        if ex_hi and hi is not None:
            hi = hi - step
    elif ex_hi is not None:
        hi = min(hi, ex_hi - step) if hi is not None else ex_hi - step
    if lo is None and hi is None:
        lo, hi = 1, 100
    elif lo is None:
        assert hi is not None
        lo = hi - 100
    elif hi is None:
        hi = lo + 100
    assert lo is not None and hi is not None
    multiple = schema.get("multipleOf")
    if multiple:
        m = float(multiple)
        k_lo, k_hi = math.ceil(lo / m), math.floor(hi / m)
        k = k_lo + seed % max(1, k_hi - k_lo + 1)
        value = k * m
        if integer or (float(value).is_integer() and float(m).is_integer()):
            return round(value)
        return value
    if integer:
        ilo, ihi = math.ceil(lo), math.floor(hi)
        if ihi < ilo:
            return ilo
        return ilo + seed % (ihi - ilo + 1)
    span = hi - lo
    value = round(lo + span * ((seed % 1000) / 1000), 2)
    return min(max(value, lo), hi)


def generate_value(
    schema: Any,
    prompt: str = "",
    *,
    _root: Any = None,
    _path: str = "$",
    _label: str = "",
    _depth: int = 0,
    _salt: int = 0,
) -> Any:
    """Return a deterministic value valid for ``schema``, mentioning ``prompt`` in strings.

    Supports ``type`` (single or list; ``null`` avoided when possible), ``enum``, ``const``,
    ``properties``/``required``/``additionalProperties``/``minProperties``, ``items``/
    ``prefixItems``/``minItems``/``maxItems``/``uniqueItems``, string ``minLength``/
    ``maxLength``/``format``/``pattern`` (best effort), numeric bounds (incl. exclusive and
    ``multipleOf``), ``$ref`` (local), ``allOf``/``anyOf``/``oneOf`` and ``default`` is ignored.
    The same schema and prompt always give the same value.
    """
    root = schema if _root is None else _root
    if _depth > 40:
        raise ValueError(f"schema too deep at {_path}")
    snippet = _snippet(prompt)
    seed = _h(prompt, _path, _salt)

    def sub(s: Any, path: str, label: str, salt: int = 0) -> Any:
        return generate_value(
            s, prompt, _root=root, _path=path, _label=label, _depth=_depth + 1, _salt=salt
        )

    if schema is True or schema is None:
        return _gen_string({}, _label, snippet, seed)
    if schema is False:
        raise ValueError(f"schema at {_path} accepts nothing")
    if not isinstance(schema, Mapping):
        raise ValueError(f"schema at {_path} is not an object")
    if "$ref" in schema:
        target = _resolve_ref(str(schema["$ref"]), root)
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        if extra and isinstance(target, Mapping):
            return sub({"allOf": [target, extra]}, _path, _label)
        return sub(target, _path, _label)
    if "allOf" in schema:
        return sub(_merge_all_of(schema, root), _path, _label)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        if not options:
            raise ValueError(f"empty enum at {_path}")
        non_null = [o for o in options if o is not None] or options
        return non_null[seed % len(non_null)]
    for combo in ("oneOf", "anyOf"):
        if combo in schema:
            options = [
                o for o in schema[combo] if not (isinstance(o, Mapping) and o.get("type") == "null")
            ]
            choice = (options or list(schema[combo]))[0]
            rest = {k: v for k, v in schema.items() if k != combo}
            if rest and isinstance(choice, Mapping):
                return sub({"allOf": [rest, choice]}, _path, _label)
            return sub(choice, _path, _label)

    typ = schema.get("type")
    if isinstance(typ, list):
        non_null_types = [t for t in typ if t != "null"]
        typ = non_null_types[0] if non_null_types else "null"
    if typ is None:
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            typ = "object"
        elif "items" in schema or "prefixItems" in schema or "minItems" in schema:
            typ = "array"
        elif any(k in schema for k in ("minimum", "maximum", "multipleOf")):
            typ = "number"
        else:
            typ = "string"

    if typ == "object":
        props: Mapping[str, Any] = schema.get("properties", {})
        required: list[str] = list(schema.get("required", []))
        result: dict[str, Any] = {}
        for name, prop_schema in props.items():
            result[name] = sub(prop_schema, f"{_path}.{name}", name)
        additional = schema.get("additionalProperties", True)
        extra_schema: Any = additional if isinstance(additional, Mapping) else {"type": "string"}
        for name in required:
            if name not in result:
                result[name] = sub(extra_schema, f"{_path}.{name}", name)
        n = 0
        while len(result) < int(schema.get("minProperties", 0)) and additional is not False:
            n += 1
            result.setdefault(f"extra_{n}", sub(extra_schema, f"{_path}.extra_{n}", f"extra_{n}"))
        return result
    if typ == "array":
        prefix: list[Any] = list(schema.get("prefixItems", []))
        items = schema.get("items", {} if not prefix else False)
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, schema.get("additionalItems", False)
        min_items = int(schema.get("minItems", 0))
        max_items = schema.get("maxItems")
        count = max(min_items, len(prefix), 1)
        if items is False:
            count = max(min_items, len(prefix)) if prefix else min_items
        if max_items is not None:
            count = min(count, int(max_items))
        unique = bool(schema.get("uniqueItems", False))
        out: list[Any] = []
        seen: list[str] = []
        for i in range(count):
            item_schema = prefix[i] if i < len(prefix) else items
            label = _label.rstrip("s") or "item"
            for salt in range(20):
                value = sub(item_schema, f"{_path}[{i}]", f"{label} {i + 1}", salt)
                canon = json.dumps(value, sort_keys=True)
                if not unique or canon not in seen:
                    break
            out.append(value)
            seen.append(canon)
        return out
    if typ == "string":
        return _gen_string(schema, _label, snippet, seed)
    if typ == "integer":
        return _gen_number(schema, True, seed)
    if typ == "number":
        return _gen_number(schema, False, seed)
    if typ == "boolean":
        return seed % 2 == 0
    if typ == "null":
        return None
    raise ValueError(f"unsupported schema type {typ!r} at {_path}")


# --------------------------------------------------------------------------------------------
# Request analysis and usage
# --------------------------------------------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _texts(content: Any) -> list[str]:
    return [str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text"]


@dataclass(frozen=True)
class _Request:
    body: dict[str, Any]
    raw_size: int
    prompt: str  # first user message text, without system reminders or markers
    all_text: str  # user/system texts (where markers and rule matches are looked for)
    turn: int  # assistant messages already in the conversation
    tools: dict[str, dict[str, Any]]

    @classmethod
    def parse(cls, body: dict[str, Any], raw_size: int) -> _Request:
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        texts: list[str] = [*_texts(body.get("system"))]
        first_user: list[str] | None = None
        for m in messages:
            if m.get("role") in ("user", "system"):
                own = [t for t in _texts(m.get("content")) if not t.startswith(_SYSTEM_REMINDER)]
                texts.extend(own)
                if first_user is None and m.get("role") == "user":
                    first_user = own
        tools = {
            str(t.get("name")): t
            for t in body.get("tools", []) or []
            if isinstance(t, dict) and t.get("name")
        }
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return cls(
            body=body,
            raw_size=raw_size,
            prompt="\n".join(first_user or []),
            all_text="\n".join(texts),
            turn=turn,
            tools=tools,
        )

    def tool_uses(self, name: str) -> list[dict[str, Any]]:
        return [
            b
            for m in self.body.get("messages", [])
            if isinstance(m, dict) and m.get("role") == "assistant"
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_use" and b.get("name") == name
        ]

    def scripted_calls(self) -> int:
        """How many scripted tool calls this conversation already made."""
        return sum(
            1
            for m in self.body.get("messages", [])
            if isinstance(m, dict) and m.get("role") == "assistant"
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_use" and str(b.get("id", "")).startswith(_SCRIPTED_ID)
        )

    def tool_result(self, tool_use_id: str) -> dict[str, Any] | None:
        for m in self.body.get("messages", []):
            if isinstance(m, dict) and m.get("role") == "user":
                for b in _blocks(m.get("content")):
                    if b.get("type") == "tool_result" and b.get("tool_use_id") == tool_use_id:
                        return b
        return None

    @property
    def cacheable_chars(self) -> int:
        return len(json.dumps(self.body.get("system", ""))) + len(
            json.dumps(self.body.get("tools", []))
        )


def compute_usage(
    raw_size: int, cacheable_chars: int, turn: int, output_chars: int
) -> dict[str, int]:
    """Deterministic token counts, about 4 characters a token.

    ``input_tokens + cache_*`` add up to ``raw_size // 4`` (at least 1). The system prompt and
    tools count as cache *creation* on the first turn of a conversation and as cache *reads*
    on later turns; ``output_tokens`` is ``output_chars // 4`` (at least 1).
    """
    total = max(1, raw_size // 4)
    cached = max(0, min(total - 1, cacheable_chars // 4))
    return {
        "input_tokens": total - cached,
        "cache_creation_input_tokens": cached if turn == 0 else 0,
        "cache_read_input_tokens": cached if turn > 0 else 0,
        "output_tokens": max(1, output_chars // 4),
    }


# --------------------------------------------------------------------------------------------
# HTTP server
# --------------------------------------------------------------------------------------------


class _Stopped(Exception):
    """The server is stopping: abandon the request."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: ModelServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "agentq-offline-model/1"

    # ---- plumbing ------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.owner.verbose:
            super().log_message(format, *args)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length > 0 else b""
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        if encoding == "gzip":
            data = gzip.decompress(data)
        elif encoding == "deflate":
            data = zlib.decompress(data)
        return data

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", f"req_offline_{uuid.uuid4().hex[:20]}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error_json(
        self, status: int, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        body = {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": f"req_offline_{uuid.uuid4().hex[:20]}",
        }
        self._send_json(status, body, headers)

    def _record(self, **kwargs: Any) -> RequestRecord:
        return self.server.owner._new_record(
            method=self.command,
            path=self.path,
            retry_count=self.headers.get("x-stainless-retry-count"),
            user_agent=self.headers.get("User-Agent"),
            auth=(
                "x-api-key"
                if self.headers.get("x-api-key")
                else "bearer"
                if (self.headers.get("Authorization") or "").lower().startswith("bearer ")
                else "none"
            ),
            **kwargs,
        )

    # ---- verbs ---------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._record(status=200, outcome="probe")
        self._send_json(200, {})

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path in ("/", "/health", "/healthz"):
            self._record(status=200, outcome="probe")
            self._send_json(200, {"status": "ok", "service": "agentq offline model server"})
        elif path == "/v1/models":
            self._record(status=200, outcome="models")
            model = {
                "type": "model",
                "id": DEFAULT_MODEL,
                "display_name": "Offline model server",
                "created_at": "2024-01-01T00:00:00Z",
            }
            self._send_json(
                200,
                {
                    "data": [model],
                    "has_more": False,
                    "first_id": model["id"],
                    "last_id": model["id"],
                },
            )
        else:
            self._record(status=404, outcome="not-found")
            self._send_error_json(404, f"no route for GET {path} (offline model server)")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        try:
            raw = self._read_body()
            body = json.loads(raw or b"{}")
        except (ValueError, OSError, EOFError) as exc:
            self._record(status=400, outcome="bad-request")
            self._send_error_json(400, f"could not read JSON body: {exc}")
            return
        if path == "/v1/messages/count_tokens":
            self._record(status=200, outcome="count_tokens")
            self._send_json(200, {"input_tokens": max(1, len(raw) // 4)})
        elif path == "/v1/messages" and isinstance(body, dict):
            try:
                self._messages(body, len(raw))
            except (_Stopped, BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            except Exception as exc:  # a bug or an unsupported schema: tell the client, once
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send_error_json(
                        500,
                        f"offline model server failed: {type(exc).__name__}: {exc}",
                        {"x-should-retry": "false"},
                    )
        else:
            self._record(status=404, outcome="not-found")
            self._send_error_json(404, f"no route for POST {path} (offline model server)")

    def do_PUT(self) -> None:
        self.do_GET()

    def do_PATCH(self) -> None:
        self.do_GET()

    def do_DELETE(self) -> None:
        self.do_GET()

    # ---- /v1/messages --------------------------------------------------------------------

    def _messages(self, body: dict[str, Any], raw_size: int) -> None:
        owner = self.server.owner
        req = _Request.parse(body, raw_size)
        stream = bool(body.get("stream"))
        try:
            scn, key, prompt = owner._scenario_for(req)
        except ScriptError as exc:
            self._record(status=400, outcome="script-error", stream=stream, prompt=req.prompt)
            self._send_error_json(400, f"offline model server script error: {exc}")
            return
        attempt, turn_attempt = owner._count(key, req.turn)
        rec = self._record(
            key=key,
            attempt=attempt,
            turn=req.turn,
            stream=stream,
            model=body.get("model"),
            tool_names=list(req.tools),
            prompt=prompt,
        )

        for d in scn.delays:
            if d.turn is None or d.turn == req.turn:
                owner._sleep(d.ms / 1000)

        for st in scn.stalls:
            if st.turn is not None and st.turn != req.turn:
                continue
            n = turn_attempt if st.turn is not None else attempt
            if st.times is not None and n > st.times:
                continue
            owner._finish_record(
                rec, status=0, outcome="stall-midstream" if st.midstream else "stall"
            )
            if st.midstream and stream:
                self._start_sse()
                self._sse(
                    "message_start",
                    {
                        "type": "message_start",
                        "message": self._message(
                            body, [], None, {"input_tokens": 1, "output_tokens": 1}
                        ),
                    },
                )
            owner._sleep(None)
            raise _Stopped

        failure = _pick_failure(scn.failures, attempt, req.turn, turn_attempt)
        if failure is not None:
            headers: dict[str, str] = {}
            if failure.retry_after is not None:
                headers["retry-after"] = f"{failure.retry_after:g}"
            if failure.no_retry:
                headers["x-should-retry"] = "false"
            owner._finish_record(rec, status=failure.status, outcome=f"error:{failure.status}")
            message = _ERROR_MESSAGES.get(
                failure.status, f"Scripted HTTP {failure.status} (offline model server)"
            )
            self._send_error_json(failure.status, message, headers)
            return

        content, stop_reason = _plan(scn, req, prompt, key)
        out_chars = len(json.dumps(content))
        usage = compute_usage(req.raw_size, req.cacheable_chars, req.turn, out_chars)
        usage.update(scn.usage)
        outcome = ",".join(
            f"tool_use:{b['name']}" if b["type"] == "tool_use" else str(b["type"]) for b in content
        )
        owner._finish_record(rec, status=200, outcome=outcome, usage=usage, content=content)
        if stream:
            self._stream(body, content, stop_reason, usage)
        else:
            self._send_json(200, self._message(body, content, stop_reason, usage))

    def _message(
        self,
        body: Mapping[str, Any],
        content: list[dict[str, Any]],
        stop_reason: str | None,
        usage: Mapping[str, int],
    ) -> dict[str, Any]:
        return {
            "id": f"msg_offline_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or DEFAULT_MODEL,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": dict(usage),
        }

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("request-id", f"req_offline_{uuid.uuid4().hex[:20]}")
        self.end_headers()
        self.close_connection = True

    def _sse(self, event: str, data: Mapping[str, Any]) -> None:
        self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(
        self,
        body: Mapping[str, Any],
        content: list[dict[str, Any]],
        stop_reason: str,
        usage: Mapping[str, int],
    ) -> None:
        self._start_sse()
        start_usage = {**usage, "output_tokens": 1}
        self._sse(
            "message_start",
            {"type": "message_start", "message": self._message(body, [], None, start_usage)},
        )
        for index, block in enumerate(content):
            if block["type"] == "tool_use":
                start = {**block, "input": {}}
                payload = json.dumps(block["input"])
                delta_type, delta_key = "input_json_delta", "partial_json"
            else:
                start = {"type": "text", "text": ""}
                payload = str(block["text"])
                delta_type, delta_key = "text_delta", "text"
            self._sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            for chunk in _chunks(payload):
                self._sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": delta_type, delta_key: chunk},
                    },
                )
            self._sse("content_block_stop", {"type": "content_block_stop", "index": index})
        self._sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": dict(usage),
            },
        )
        self._sse("message_stop", {"type": "message_stop"})


def _chunks(text: str) -> Iterator[str]:
    if not text:
        yield ""
        return
    for i in range(0, len(text), _SSE_CHUNK):
        yield text[i : i + _SSE_CHUNK]


def _pick_failure(
    failures: Sequence[Failure], attempt: int, turn: int, turn_attempt: int
) -> Failure | None:
    """Failures without ``turn`` are consumed in order by the key's attempt number; those with
    ``turn`` likewise by the attempt number of that key and turn."""
    for group, n in (
        ([f for f in failures if f.turn is None], attempt),
        ([f for f in failures if f.turn == turn], turn_attempt),
    ):
        used = 0
        for f in group:
            if f.times is None or n <= used + f.times:
                return f
            used += f.times
    return None


def _plan(scn: Scenario, req: _Request, prompt: str, key: str) -> tuple[list[dict[str, Any]], str]:
    """Decide the assistant content of one successful turn."""
    snippet = _snippet(prompt)
    tool_id_seed = _h(key, prompt, req.turn)
    scripted_done = req.scripted_calls()
    if scripted_done < len(scn.tools):
        call = scn.tools[scripted_done]
        block = {
            "type": "tool_use",
            "id": f"{_SCRIPTED_ID}{scripted_done}_{tool_id_seed:012x}",
            "name": call.name,
            "input": call.input,
        }
        return [block], "tool_use"

    so_tool = req.tools.get(STRUCTURED_OUTPUT_TOOL)
    if so_tool is not None:
        previous = req.tool_uses(STRUCTURED_OUTPUT_TOOL)
        accepted = False
        if previous:
            result = req.tool_result(str(previous[-1].get("id")))
            accepted = result is not None and not result.get("is_error")
        if not accepted:
            if scn.has_output and (scn.output_times is None or len(previous) < scn.output_times):
                value = scn.output
            else:
                value = generate_value(so_tool.get("input_schema", {}), prompt)
            block = {
                "type": "tool_use",
                "id": f"toolu_offline_{tool_id_seed:012x}",
                "name": STRUCTURED_OUTPUT_TOOL,
                "input": value,
            }
            return [block], "tool_use"
        text = scn.text or "Structured output submitted."
        return [{"type": "text", "text": text}], "end_turn"

    text = scn.text or f"Offline model answer to: {snippet}"
    return [{"type": "text", "text": text}], "end_turn"


class ModelServer:
    """Loopback HTTP server answering the Anthropic Messages API deterministically.

    Use as a context manager or call :meth:`start` / :meth:`stop`. ``script`` is a JSON/YAML
    path or already-parsed rules (see the module docstring for the grammar).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        script: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        *,
        verbose: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.verbose = verbose
        self.rules: list[Rule] = load_script(script) if script is not None else []
        self.request_log: list[RequestRecord] = []
        self._counts: dict[str, int] = {}
        self._turn_counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> ModelServer:
        if self._httpd is not None:
            return self
        self._stop.clear()
        self._httpd = _HTTPServer((self.host, self.port), self)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"model-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; release stalled requests and close every open connection."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        httpd.shutdown()
        with self._lock:
            conns = list(self._connections)
            self._connections.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("ModelServer is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    # ---- scripting and inspection --------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        """``/v1/messages`` requests received per scenario key (a copy)."""
        with self._lock:
            return dict(self._counts)

    def add_rule(self, rule: Mapping[str, Any]) -> Rule:
        """Append one script rule (same fields as in a script file)."""
        parsed = _rule_from_mapping(rule, len(self.rules))
        with self._lock:
            self.rules.append(parsed)
        return parsed

    def reset(self) -> None:
        """Forget the request log and all counters (rules stay)."""
        with self._lock:
            self.request_log.clear()
            self._counts.clear()
            self._turn_counts.clear()

    def requests(self, key: str | None = None) -> list[RequestRecord]:
        """``/v1/messages`` records, optionally only those of one scenario key."""
        with self._lock:
            return [
                r for r in self.request_log if r.key is not None and (key is None or r.key == key)
            ]

    def wait_for(
        self,
        predicate: Callable[[RequestRecord], bool] | None = None,
        *,
        count: int = 1,
        timeout: float = 10.0,
    ) -> bool:
        """Block until ``count`` records satisfy ``predicate`` (default: any /v1/messages
        request). Returns False on timeout."""
        check = predicate or (lambda r: r.key is not None)
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(1 for r in self.request_log if check(r)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return False
                self._changed.wait(remaining)
            return True

    # ---- internals used by the handler ---------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _sleep(self, seconds: float | None) -> None:
        """Sleep (None: until stop); raise _Stopped if the server stops meanwhile."""
        if self._stop.wait(seconds):
            raise _Stopped

    def _scenario_for(self, req: _Request) -> tuple[Scenario, str, str]:
        marker_scn, _ = parse_markers(req.all_text)
        _, prompt = parse_markers(req.prompt)
        prompt = prompt.strip()
        scn = Scenario()
        key: str | None = None
        for rule in self.rules:
            if rule.matches(req.all_text):
                scn, key = rule.scenario, rule.key
                break
        if marker_scn is not None:
            scn = scn.merge(marker_scn) if key is not None else marker_scn
            key = marker_scn.key or key or marker_scn.source
        return scn, key or DEFAULT_KEY, prompt

    def _count(self, key: str, turn: int) -> tuple[int, int]:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._turn_counts[(key, turn)] = self._turn_counts.get((key, turn), 0) + 1
            return self._counts[key], self._turn_counts[(key, turn)]

    def _new_record(self, **kwargs: Any) -> RequestRecord:
        with self._changed:
            rec = RequestRecord(index=len(self.request_log), received_at=time.time(), **kwargs)
            self.request_log.append(rec)
            self._changed.notify_all()
            return rec

    def _finish_record(
        self,
        rec: RequestRecord,
        *,
        status: int,
        outcome: str,
        usage: dict[str, int] | None = None,
        content: list[dict[str, Any]] | None = None,
    ) -> None:
        with self._changed:
            rec.status = status
            rec.outcome = outcome
            rec.usage = usage
            rec.response_content = content or []
            self._changed.notify_all()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentq.local.model_server",
        description="Offline stand-in for the Anthropic Messages API (development only).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="JSON or YAML rules file")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")
    args = parser.parse_args(argv)

    server = ModelServer(args.host, args.port, args.script, verbose=args.verbose)
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    server.start()
    print(server.url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        server.stop()
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
