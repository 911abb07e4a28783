"""The console's Tasks page: a tenant's tasks on their own (not in a job), from every
producer path (agentq's producers, the bus, raw SQS messages, messages rejected).

Listed from the tenant's newest `SCANNED_EVENTS` events (one Query, one BatchGetItem:
two requests a refresh however busy the tenant is); a search reads further, a page at
a time until `SHOWN` match, up to `SEARCH_EVENTS` events in its time range, and a whole
request id is read directly.
The reads and their bounds: docs/console.md ("What it reads, and what a refresh
costs").
"""

from __future__ import annotations

from typing import Any, Final

from agentq.client import AgentqClient
from agentq.client.parts import rejected_record
from agentq.console.jobtasks import BATCH, read_states, state_row
from agentq.console.search import Filters
from agentq.envelope import REQUEST_ID_PATTERN
from agentq.events import STATE_AFTER, standalone_request_id
from agentq.store import TaskRecord

SCANNED_EVENTS: Final = 500
SEARCH_EVENTS: Final = 20_000
SHOWN: Final = 50


class StandaloneTasks:
    def __init__(self, client: AgentqClient) -> None:
        self._client = client
        self._table = client.settings.required("table_name")

    def page(self, tenant: str, filters: Filters | None = None) -> dict[str, Any]:
        """`{"tenant", "tasks": rows newest first, "scanned": events read, "more": whether
        older events were left unread}`."""
        if filters is not None and filters.active:
            return self.search(tenant, filters)
        events = self._client.event_store.newest_tenant_events(tenant, limit=SCANNED_EVENTS)
        latest: dict[str, dict[str, Any]] = {}  # each task's newest event
        for event in events:
            request_id = standalone_request_id(event)
            if request_id is not None:
                latest.setdefault(request_id, event)
        newest = list(latest)[:SHOWN]
        records = (
            read_states(self._client.dynamodb, self._table, tenant, newest, "recent tasks")
            if newest
            else {}
        )
        rows = []
        for request_id in newest:
            # A message the worker rejected has no STATE item: its `Task Failed` stands in.
            record = records.get(request_id) or rejected_record([latest[request_id]])
            if record is not None:
                rows.append(state_row(record) | {"definition": record.definition})
        return {
            "tenant": tenant,
            "tasks": rows,
            "scanned": len(events),
            "more": len(events) >= SCANNED_EVENTS,
        }

    def search(self, tenant: str, filters: Filters) -> dict[str, Any]:
        """The tasks matching `filters`, newest first (`SHOWN` at most). The events are
        read a page at a time, and each page's new candidates checked against their STATE
        items, until `SHOWN` match or the range is read: the tasks a page names first
        come after every task named on the pages before it."""
        latest: dict[str, dict[str, Any]] = {}
        hinted: dict[str, tuple[str | None, set[str]]] = {}  # newest state named, definitions
        rows = self._exact(tenant, filters)
        shown = {row["requestId"] for row in rows}
        scanned, complete = 0, False
        pages = self._client.event_store.search_tenant_events(
            tenant, since_ms=filters.since_ms, until_ms=filters.until_ms,
            id_contains=filters.text, budget=SEARCH_EVENTS,
        )  # fmt: skip
        for events, last in pages:
            scanned, complete = scanned + len(events), last
            named = _note(events, latest, hinted)
            # A task named on an earlier page was checked then: what this page adds about
            # it (an older state or definition) cannot bring it back.
            candidates = [rid for rid in named if _may_match(filters, *hinted[rid])]
            if self._check(tenant, filters, candidates, latest, rows, shown):
                break
        return {
            "tenant": tenant,
            "tasks": rows[:SHOWN],
            "scanned": scanned,
            "more": not complete or len(rows) > SHOWN,
            "filters": filters.echo(),
        }

    def _check(self, tenant: str, filters: Filters, candidates: list[str],
               latest: dict[str, dict[str, Any]], rows: list[dict[str, Any]],
               shown: set[str]) -> bool:  # fmt: skip
        """Add the candidates whose STATE item matches to `rows`, 100 at a time; whether
        `SHOWN` rows are found."""
        for start in range(0, len(candidates), BATCH):
            if len(rows) >= SHOWN:
                return True
            chunk = [rid for rid in candidates[start : start + BATCH] if rid not in shown]
            if not chunk:
                continue
            records = read_states(self._client.dynamodb, self._table, tenant, chunk, "search")
            for request_id in chunk:
                record = records.get(request_id) or rejected_record([latest[request_id]])
                if record is not None and _matches(filters, record):
                    rows.append(state_row(record) | {"definition": record.definition})
        return len(rows) >= SHOWN

    def _exact(self, tenant: str, filters: Filters) -> list[dict[str, Any]]:
        """A whole request id given as the search text: that task, in a job or not."""
        if not filters.text or not REQUEST_ID_PATTERN.fullmatch(filters.text):
            return []
        record = self._client.tasks.get(tenant, filters.text)
        if record is None or not _matches(filters, record):
            return []
        return [state_row(record) | {"definition": record.definition, "jobId": record.job_id}]


def _note(events: list[dict[str, Any]], latest: dict[str, dict[str, Any]],
          hinted: dict[str, tuple[str | None, set[str]]]) -> list[str]:  # fmt: skip
    """Note each task's newest event, newest state named and definitions; returns the
    tasks these events name first, newest first."""
    named: list[str] = []
    for event in events:
        request_id = standalone_request_id(event)
        if request_id is None:
            continue
        if request_id not in latest:
            latest[request_id] = event
            named.append(request_id)
        state, definitions = hinted.setdefault(request_id, (_state_named(event), set()))
        if state is None:
            hinted[request_id] = (_state_named(event), definitions)
        if isinstance(event.get("definition"), str):
            definitions.add(event["definition"])
    return named


def _state_named(event: dict[str, Any]) -> str | None:
    state = STATE_AFTER.get(str(event.get("detailType")))  # type: ignore[call-overload]
    return state.value if state is not None else None


def _may_match(filters: Filters, state: str | None, definitions: set[str]) -> bool:
    """What the events say rules a task out (its STATE item has the last word)."""
    if filters.state and state is not None and state != filters.state:
        return False
    return not (filters.definition and definitions and filters.definition not in definitions)


def _matches(filters: Filters, record: TaskRecord) -> bool:
    if filters.state and record.state.value != filters.state:
        return False
    if filters.definition and record.definition != filters.definition:
        return False
    created = record.created_at_ms
    if filters.since_ms is not None and created is not None and created < filters.since_ms:
        return False
    return not (filters.until_ms is not None and created is not None
                and created > filters.until_ms)  # fmt: skip
