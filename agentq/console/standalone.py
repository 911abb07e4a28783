"""The console's Tasks page: a tenant's tasks submitted on their own (not in a job).

They are found through the tenant's newest stored events, one Query of the byTenant
index of at most `SCANNED_EVENTS` items, and read from their STATE items in one
BatchGetItem. A page left open costs two requests per refresh however busy the tenant
is; the price is that a task older than the tenant's newest `SCANNED_EVENTS` events is
not listed (the page says so, and `/tasks/ID` still shows it).
"""

from __future__ import annotations

from typing import Any, Final

from agentq.client import AgentqClient
from agentq.console.jobtasks import read_states, state_row

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
        submitted = [
            str(event["requestId"])
            for event in events
            if event.get("detailType") == "Task Pending"
            and not event.get("jobId")
            and event.get("requestId")
        ]
        newest = list(dict.fromkeys(submitted))[:SHOWN]  # a retry re-enters PENDING
        records = (
            read_states(self._client.dynamodb, self._table, tenant, newest, "recent tasks")
            if newest
            else {}
        )
        rows = [
            state_row(records[request_id]) | {"definition": records[request_id].definition}
            for request_id in newest
            if request_id in records
        ]
        return {
            "tenant": tenant,
            "tasks": rows,
            "scanned": len(events),
            "more": len(events) >= SCANNED_EVENTS,
        }
