"""The ``[[model: ...]]`` directive grammar: scanner, qualifiers, and the parsers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from agentq.local.model_server.scenario import (
    MARKER_CLOSE,
    MARKER_OPEN,
    Delay,
    Failure,
    Scenario,
    ScriptError,
    Stall,
    ToolCall,
)


@dataclass(frozen=True)
class _Token:
    raw: str
    value: Any
    is_json: bool


_DECODER: Final = json.JSONDecoder()
_WORD_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
USAGE_NAMES: Final[Mapping[str, str]] = {
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
            if not sep or name not in USAGE_NAMES:
                raise ScriptError(f"usage: expected NAME=INT (input/output/...), got {tok.raw!r}")
            try:
                scn.usage[USAGE_NAMES[name]] = int(num)
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
