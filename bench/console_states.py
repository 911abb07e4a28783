"""A task in each state a task page must explain, made without a worker.

Each is reached through the product's own calls (submit, cancel, the lock a worker
takes, the transitions it writes, the event it stores for a message it rejected), so
the console's task page, `agentq status` and the screenshots see what a stage holds.
Shared by the console's state tests and `python -m bench.console --screenshots`.
"""

from __future__ import annotations

from agentq.client import AgentqClient
from agentq.envelope import TaskEnvelope
from agentq.events import REJECTED_REASON, Event, now_ms
from agentq.states import TaskState
from agentq.store.events import EventStore
from agentq.store.leases import Lease
from agentq.store.tenants import TenantLimitStore
from agentq.taxonomy import info

LIMITED_TENANT = "busy"
HOLDER = "w-test"


def hold(client: AgentqClient, request_id: str, *, tenant: str | None = None,
         limit: int = 0) -> Lease:  # fmt: skip
    """Lock the task as a worker would (PROCESSING, attempt 1), through the real lock."""
    record = client.get_task(request_id, tenant=tenant)
    envelope = TaskEnvelope.from_dict(record.envelope or {}, default_tenant=record.tenant)
    return client.tasks.acquire(envelope, worker_id=HOLDER, lease_seconds=600,
                                max_attempts=3, tenant_limit=limit)  # fmt: skip


def tasks_in_each_state(client: AgentqClient, definition: str) -> dict[str, tuple[str, str]]:
    """(request id, tenant) by state name: pending, scheduled, cancelled, processing,
    timeout, failed, retrying, completed, rejected (at receive), blocked, at-limit."""
    me = client.settings.tenant_id
    table = client.settings.required("table_name")
    found = {
        "pending": client.submit(definition, {"n": 1}).request_id,
        "scheduled": client.submit(definition, {"n": 2}, delay=3600).request_id,
        "cancelled": client.submit(definition, {"n": 3}).request_id,
        "processing": client.submit(definition, {"n": 4}).request_id,
    }
    client.cancel(found["cancelled"])
    hold(client, found["processing"])
    # Ended as the worker ends a task past its deadline, and as it ends a last attempt.
    for name, state in (("timeout", TaskState.TIMEOUT), ("failed", TaskState.FAILED)):
        found[name] = client.submit(definition, {"n": name}).request_id
        error = {"category": "timeout" if name == "timeout" else "network", "retryable": True,
                 "message": "killed after 20 ms", "exception_type": "TaskTimeout"}  # fmt: skip
        client.tasks.finalize(hold(client, found[name]), state, fields={"error": error})
    # A failed attempt with attempts left, and a finished one.
    found["retrying"] = client.submit(definition, {"n": "retrying"}).request_id
    network = {"category": "network", "retryable": True, "message": "connection reset",
               "exception_type": "ConnectionError"}  # fmt: skip
    client.tasks.finalize(hold(client, found["retrying"]), TaskState.RETRYING,
                          retry_at_ms=now_ms() + 60_000, fields={"error": network})  # fmt: skip
    found["completed"] = client.submit(definition, {"n": "completed"}).request_id
    client.tasks.finalize(hold(client, found["completed"]), TaskState.COMPLETED)
    # A message a worker rejected at receive: no STATE item, only the `Task Failed` it
    # stored (as the save-event Lambda stores it).
    found["rejected"] = "rejected-at-receive-1"
    refused = info("validation", "input.document: field required", "InvalidInput")
    EventStore(client.dynamodb, table, app_name=client.settings.app_name).append(Event(
        detail_type="Task Failed", request_id=found["rejected"], tenant=me,
        payload={"error": refused.to_record(), "reason": REJECTED_REASON, "messageId": "m-1"},
    ))  # fmt: skip
    client.create_job({"tasks": {"first": {"definition": definition},
                                 "second": {"definition": definition, "depends_on": ["first"]}}},
                      job_id="states")  # fmt: skip
    found["blocked"] = "states-second"
    TenantLimitStore(client.dynamodb, table).set(LIMITED_TENANT, 1)
    running = client.submit(definition, {"n": 5}, tenant=LIMITED_TENANT).request_id
    hold(client, running, tenant=LIMITED_TENANT, limit=1)
    out = {name: (rid, me) for name, rid in found.items()}
    waiting = client.submit(definition, {"n": 6}, tenant=LIMITED_TENANT).request_id
    out["at-limit"] = (waiting, LIMITED_TENANT)
    return out
