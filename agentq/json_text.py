"""Reading JSON that agentq did not write: message bodies, request bodies, task output.

Two readers, one per trust:
- `decode_json` is strict, for what agentq goes on to store or act on (a message body,
  an API request, a task's usage file): no ``NaN``/``Infinity``, no number that overflows
  to one, no nesting deeper than `MAX_NESTING`.
- `decode_lenient` reads what a task wrote as `json.loads` reads it, for showing it back
  to its producer (a result, a trace, a CLI argument).

Neither lets a hostile text escape as anything but `InvalidInput`: json's C decoder
recurses per level (`RecursionError` at about 1,000) and refuses an integer of more than
4,300 digits with a bare `ValueError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from agentq.errors import InvalidInput

# Brackets deep in a body, counted before decoding: json's C decoder recurses per level
# and a 10,000-deep body raises RecursionError instead of a decode error. 32 is also
# DynamoDB's nesting limit, and the envelope (with its input) is kept on the STATE item.
MAX_NESTING: Final = 32
_STRING_OR_BRACKET: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def decode_json(text: str, *, name: str = "body") -> Any:
    """Decode untrusted JSON, or raise `InvalidInput` naming what is wrong with it.

    Stricter than `json.loads`: no ``NaN``/``Infinity`` and no number that overflows to
    one (``1e309``), which no other JSON reader accepts and `json.dumps` re-emits as
    invalid JSON; nesting deeper than `MAX_NESTING` is refused before decoding.
    """
    deepest = nesting(text)
    if deepest > MAX_NESTING:
        raise InvalidInput(name, f"nested {deepest} levels deep; the limit is {MAX_NESTING}")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except InvalidInput as exc:  # from the two hooks, which cannot know the name
        raise InvalidInput(name, exc.problem) from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(name, f"not JSON: {exc.msg} at {exc.pos}") from None
    except RecursionError:  # the scan above should make this unreachable
        raise InvalidInput(name, "nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4,300 digits, say
        raise InvalidInput(name, f"not JSON: {str(exc)[:120]}") from None


def decode_lenient(data: str | bytes, *, name: str, what: str = "") -> Any:
    """JSON as `json.loads` reads it (``NaN`` and all), or `InvalidInput` naming `name`:
    "`what` is not JSON: ..." for a syntax error, "... agentq can read" for text json
    cannot decode at all (not UTF-8, nested too deep, an integer too long)."""
    not_json = f"{what} is not JSON" if what else "not JSON"
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise InvalidInput(name, f"{not_json}: {exc.msg} at {exc.pos}") from None
    except (ValueError, RecursionError):
        raise InvalidInput(name, f"{not_json} agentq can read") from None


def decode_or_none(text: str) -> Any:
    """The text decoded with ``NaN`` and ``Infinity`` read as null; None if it does not
    decode. For reporting a message that may not parse, never for acting on it."""
    if nesting(text) > MAX_NESTING:
        return None
    try:
        return json.loads(text, parse_constant=lambda _: None)
    except (ValueError, RecursionError):
        return None


def nesting(text: str) -> int:
    """How deep the brackets of `text` go, outside its strings (not checked as JSON)."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _no_constant(token: str) -> Any:
    raise InvalidInput("body", f"holds {token}, which JSON does not allow")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise InvalidInput("body", f"number {token[:40]} is out of range")
    return value
