"""The search and filters of the Tasks and Jobs pages, read from the page's URL.

Every filter arrives in the query string (a search is a link to share) and is untrusted:
each is checked against the pattern of what it filters (a task state, a definition name,
the characters of an id, an ISO time) before any AWS call, anything else is
`InvalidInput` (a 400 page), and what a page echoes back is drawn as DOM text.
The parameters and what they filter: docs/console.md ("Search and filters").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from agentq.envelope import DEFINITION_PATTERN
from agentq.errors import InvalidInput
from agentq.states import TaskState

# What may stand in an id search: the characters of request and job ids, nothing else.
ID_TEXT: Final = re.compile(r"[a-zA-Z0-9_-]{1,128}")
TASK_STATES: Final = tuple(state.value for state in TaskState)
_TIME: Final = re.compile(r"[0-9T:.+\- Z]{4,40}")


@dataclass(frozen=True, kw_only=True)
class Filters:
    state: str | None = None
    definition: str | None = None
    text: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.state, self.definition, self.text,
                                          self.since_ms, self.until_ms))  # fmt: skip

    def echo(self) -> dict[str, Any]:
        """The filters as the page's form shows them again (validated values only)."""
        return {"state": self.state, "definition": self.definition, "q": self.text,
                "since": _iso(self.since_ms), "until": _iso(self.until_ms)}  # fmt: skip


def parse_filters(params: Mapping[str, str], *, states: tuple[str, ...]) -> Filters:
    """The filters of a page's query string; `InvalidInput` naming the bad one."""
    state = _blank(params.get("state"))
    if state == "ALL":
        state = None
    if state is not None and state not in states:
        raise InvalidInput("state", f"one of {', '.join(states)}")
    definition = _blank(params.get("definition"))
    if definition is not None and not DEFINITION_PATTERN.fullmatch(definition):
        raise InvalidInput("definition", f"must match {DEFINITION_PATTERN.pattern}")
    text = _blank(params.get("q"))
    if text is not None and not ID_TEXT.fullmatch(text):
        raise InvalidInput("q", "part of an id: letters, digits, '-' and '_' (up to 128)")
    since, until = _time(params.get("since"), "since"), _time(params.get("until"), "until")
    if since is not None and until is not None and since > until:
        raise InvalidInput("since", "must not be after until")
    return Filters(state=state, definition=definition, text=text, since_ms=since, until_ms=until)


def _blank(value: str | None) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _time(value: str | None, name: str) -> int | None:
    value = _blank(value)
    if value is None:
        return None
    if not _TIME.fullmatch(value):
        raise InvalidInput(name, "an ISO time such as 2026-12-01T09:30 (UTC)")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(name, "an ISO time such as 2026-12-01T09:30 (UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not 2000 <= moment.year <= 9999:
        raise InvalidInput(name, "a year from 2000")
    return int(moment.timestamp() * 1000)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
