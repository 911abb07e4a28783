"""The console's Tasks page: a tenant's tasks on their own (not in a job), from every
producer path (agentq's producers, the bus, raw SQS messages, messages rejected).

They are found through the tenant's newest stored events of any task, one Query of the byTenant
index of at most `SCANNED_EVENTS` items, and read from their STATE items in one
BatchGetItem. A page left open costs two requests per refresh however busy the tenant
is; the price is that a task older than the tenant's newest `SCANNED_EVENTS` events is
not listed (the page says so, and `/tasks/ID` still shows it).
"""

from __future__ import annotations

from typing import Any, Final

from agentq.client import AgentqClient
from agentq.client.parts import rejected_record
from agentq.console.jobtasks import read_states, state_row
from agentq.events import standalone_request_id

SCANNED_EVENTS: Final = 500
SHOWN: Final = 50


class StandaloneTasks:
    def __init__(self, client: AgentqClient) -> None:
        self._client = client
        self._table = client.settings.required("table_name")

    def page(self, tenant: str) -> dict[str, Any]:
        """`{"tenant", "tasks": rows newest first, "scanned": events read, "more": whether
        older events were left unread}`."""
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
