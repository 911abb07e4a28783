"""One string matching a JSON Schema ``pattern``, deterministically (best effort).

Why a small parser of our own: the stdlib's regex parser is ``sre_parse`` (deprecated)
or ``re._parser`` (private), and the generators on PyPI (exrex, rstr, hypothesis's
``from_regex``) are built on that same private parser; hypothesis's is also random
by design and a test-only dependency. Schema patterns use a small, well-defined part
of the syntax, which this module reads:

    alternation ``a|b``, groups ``(...)`` ``(?:...)`` ``(?P<n>...)`` ``(?<n>...)``,
    classes ``[...]`` ``[^...]`` with ranges and ``\\d \\w \\s`` (and negations),
    ``.``, anchors ``^ $ \\b \\B \\A \\Z``, quantifiers ``* + ? {m} {m,} {m,n}``
    (lazy or possessive too), escaped literals, ``\\n \\t \\r \\f \\v \\xHH \\uHHHH``.

Anything else (lookarounds, backreferences, flags) gives ``None`` and the caller
falls back; so does a sample that ``re`` does not find the pattern in, which makes
``re`` the judge of every answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

_CATEGORY: Final = {"d": "7", "w": "a", "s": " "}
_NEGATED: Final = {"D": "-", "W": "-", "S": "-"}
_CONTROL: Final = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_ANCHORS: Final = frozenset("bBAZ")
_MAX_DEPTH: Final = 50


class _Unsupported(Exception):
    """The pattern uses syntax outside the subset above."""


@dataclass
class _Reader:
    pattern: str
    seed: int
    i: int = 0
    depth: int = field(default=0)

    def peek(self) -> str | None:
        return self.pattern[self.i] if self.i < len(self.pattern) else None

    def take(self) -> str:
        if self.i >= len(self.pattern):
            raise _Unsupported("unexpected end")
        ch = self.pattern[self.i]
        self.i += 1
        return ch

    def alternation(self) -> str:
        """Sample ``seq (| seq)*``: the branch the seed picks, as sre_parse's sampler did."""
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[self.seed % len(branches)]

    def sequence(self) -> str:
        out: list[str] = []
        while (ch := self.peek()) is not None and ch not in "|)":
            atom = self.atom()
            out.append(atom * self.repeat_min())
        return "".join(out)

    def atom(self) -> str:
        ch = self.take()
        if ch == "(":
            return self.group()
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return "x"
        if ch in "^$":
            return ""
        if ch == "\\":
            esc = self.escape()
            return "" if esc is None else esc
        if ch in "*+?{" and not (ch == "{" and not self.counts_ahead()):
            raise _Unsupported(f"nothing to repeat at {self.i - 1}")
        if ch == ")":
            raise _Unsupported("unbalanced )")
        return ch

    def group(self) -> str:
        if self.peek() == "?":
            self.i += 1
            kind = self.take()
            named = (kind == "P" and self.peek() == "<") or (
                kind == "<" and self.peek() not in ("=", "!")
            )
            if named:
                end = self.pattern.find(">", self.i)
                if end == -1:
                    raise _Unsupported("unterminated group name")
                self.i = end + 1
            elif kind != ":":
                raise _Unsupported(f"group (?{kind}")
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Unsupported("pattern too deep")
        inner = self.alternation()
        self.depth -= 1
        if self.take() != ")":
            raise _Unsupported("unbalanced (")
        return inner

    def escape(self) -> str | None:
        """An escape outside a class: its sample, or None for a zero-width anchor."""
        ch = self.take()
        if ch in _ANCHORS:
            return None
        return self.escaped_char(ch)

    def escaped_char(self, ch: str) -> str:
        if ch in _CATEGORY:
            return _CATEGORY[ch]
        if ch in _NEGATED:
            return _NEGATED[ch]
        if ch in _CONTROL:
            return _CONTROL[ch]
        if ch in "xu":
            width = 2 if ch == "x" else 4
            digits = self.pattern[self.i : self.i + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise _Unsupported(f"bad \\{ch} escape")
            self.i += width
            return chr(int(digits, 16))
        if ch.isalnum():  # backreferences and unknown letters
            raise _Unsupported(f"escape \\{ch}")
        return ch

    def char_class(self) -> str:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        start = self.i
        chars: list[str] = []
        first = True
        while True:
            ch = self.take()
            if ch == "]" and not first:
                break
            first = False
            item = self.escaped_char(self.take()) if ch == "\\" else ch
            if self.peek() == "-" and self.pattern[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                high = self.take()
                if high == "\\":
                    self.escaped_char(self.take())
            chars.append(item)  # a range samples as its low end
        if negate:
            # Any character outside the listed ones (ranges included) will do; re checks.
            listed = f"[{self.pattern[start : self.i]}"
            return next((c for c in "aZ0_-x~" if not re.fullmatch(listed, c)), "~")
        return chars[self.seed % len(chars)] if chars else "a"

    def counts_ahead(self) -> bool:
        return re.match(r"\{\d+(,\d*)?\}", self.pattern[self.i - 1 :]) is not None

    def repeat_min(self) -> int:
        """Read a quantifier after an atom; the sample repeats the atom its minimum times."""
        ch = self.peek()
        if ch is None or ch not in "*+?{":
            return 1
        if ch == "{":
            m = re.match(r"\{(\d+)(,\d*)?\}", self.pattern[self.i :])
            if m is None:
                return 1  # a literal brace, read as an atom next
            self.i += m.end()
            low = int(m.group(1))
        else:
            self.i += 1
            low = 1 if ch == "+" else 0
        if self.peek() in ("?", "+"):  # lazy or possessive: the same strings match
            self.i += 1
        return low


def pattern_sample(pattern: str, seed: int) -> str | None:
    """A string that ``re.search(pattern, ...)`` finds the pattern in, or None."""
    try:
        re.compile(pattern)
    except re.error:
        return None
    reader = _Reader(pattern, seed)
    try:
        candidate = reader.alternation()
        if reader.i != len(pattern):
            return None
    except _Unsupported:
        return None
    return candidate if re.search(pattern, candidate) else None
