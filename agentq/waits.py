"""Why a live task is not running yet, in one sentence: what the console's task page and
`agentq status` say for a SCHEDULED, BLOCKED, PENDING, PROCESSING or RETRYING task.

`wait_reason` is the wording (pure); `explain_wait` reads what it needs: for a BLOCKED
job task the states of the tasks it waits for (one batch read of those alone), for a
PENDING task of a tenant with a limit the tenant's seats (one query), and for every
PENDING task how many of its tier are queued ahead of it (agentq.store.queue_position:
one query per status shard).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.errors import AgentqError
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store.queue_position import QueuePosition, queue_position
from agentq.store.records import TaskRecord

if TYPE_CHECKING:
    from agentq.client.producer import AgentqClient

# How many unfinished upstream tasks a BLOCKED task's reason names before "and N more".
NAMED_BLOCKERS: Final = 5


def wait_reason(
    record: TaskRecord,
    *,
    now: int,
    blockers: Sequence[str] | None = None,
    seats: tuple[int, int] | None = None,
    position: QueuePosition | None = None,
) -> str | None:
    """None for a finished task. `blockers`: the unfinished tasks a BLOCKED task waits
    for (None: unknown); `seats`: (running, limit) of a PENDING task's limited tenant;
    `position`: how many PENDING tasks of its tier are ahead of it (None: unknown)."""
    raw = record.raw
    state = record.state
    if state is TaskState.SCHEDULED:
        due = raw.get("notBefore")
        if isinstance(due, int):
            left = max(0, due - now) / 1000
            return f"scheduled: starts at {_iso(due)} or soon after (in {_span(left)})"
        return "scheduled: waiting for its start time"
    if state is TaskState.BLOCKED:
        if not blockers:
            return "blocked: waiting for the job's earlier tasks"
        named = ", ".join(blockers[:NAMED_BLOCKERS])
        more = len(blockers) - NAMED_BLOCKERS
        return f"blocked: waiting for {named}" + (f" and {more} more" if more > 0 else "")
    if state is TaskState.PENDING:
        if seats is not None and seats[0] >= seats[1]:
            return (f"queued: tenant {record.tenant} is at its limit "
                    f"({seats[0]} of {seats[1]} running); it starts when one ends")  # fmt: skip
        if position is not None:
            return "queued: " + behind(position, record.tenant)
        return "queued: waiting for a free worker slot"
    if state is TaskState.RETRYING:
        error = raw.get("error")
        why = error.get("category") if isinstance(error, dict) else None
        return (f"retrying: attempt {record.attempt} failed" + (f" ({why})" if why else "")
                + "; the next attempt starts after a back-off")  # fmt: skip
    if state is TaskState.PROCESSING:
        until = record.effective_until_ms
        lease = f", lease until {_iso(until)}" if until else ""
        return f"running: attempt {record.attempt} on {record.owner or 'a worker'}{lease}"
    return None


def explain_wait(client: AgentqClient, record: TaskRecord) -> str | None:
    """`wait_reason` with what it needs read from the stage (at most two requests, six
    for a PENDING task: its tenant's limit and seats, and one query per status shard)."""
    if record.state is TaskState.BLOCKED and record.job_id:
        return wait_reason(record, now=now_ms(), blockers=_blockers(client, record))
    if record.state is TaskState.PENDING:
        seats = _seats(client, record)
        at_limit = seats is not None and seats[0] >= seats[1]
        position = None if at_limit else _position(client, record)
        return wait_reason(record, now=now_ms(), seats=seats, position=position)
    return wait_reason(record, now=now_ms())


def behind(position: QueuePosition, tenant: str) -> str:
    """'behind N task(s) of tier T (M of them tenant X's)', or 'first in tier T'."""
    if position.ahead == 0:
        return f"first in tier {position.tier}, waiting for a free worker slot"
    more = "more than " if position.capped else ""
    return (f"behind {more}{position.ahead} task(s) of tier {position.tier} "
            f"({position.ahead_same_tenant} of them tenant {tenant}'s)")  # fmt: skip


def _position(client: AgentqClient, record: TaskRecord) -> QueuePosition | None:
    try:
        return queue_position(client.dynamodb, client.settings.required("table_name"), record,
                              default_tier=client.settings.default_priority)  # fmt: skip
    except (ClientError, BotoCoreError):
        return None  # a courtesy, as the others: "queued" without the count


def _blockers(client: AgentqClient, record: TaskRecord) -> list[str] | None:
    key = record.raw.get("taskKey") or (record.envelope or {}).get("taskKey")
    try:
        job = client.get_job(str(record.job_id), tenant=record.tenant)
    except (AgentqError, ClientError, BotoCoreError):
        return None  # a courtesy: the page shows the task without naming its blockers
    spec = next((t for t in job.spec.tasks if t.key == key), None)
    if spec is None or not spec.depends_on:
        return None
    states = client.dispatcher.task_states(record.tenant, job.job_id, list(spec.depends_on))
    return [k for k in spec.depends_on if (s := states.get(k)) is None
            or s.state is not TaskState.COMPLETED]  # fmt: skip


def _seats(client: AgentqClient, record: TaskRecord) -> tuple[int, int] | None:
    from agentq.store.tenants import TenantLimitStore

    store = TenantLimitStore(client.dynamodb, client.settings.required("table_name"))
    try:
        # The override, else the stage's default as this process's settings know it.
        limit = store.get(record.tenant) or client.settings.tenant_concurrency_limit
        if not limit:
            return None
        running = sum(1 for seat in store.seats(record.tenant) if seat.live(now_ms()))
    except (ClientError, BotoCoreError):
        return None  # a courtesy, as above: "queued" without the limit's figures
    return running, limit


def _iso(ms: Any) -> str:
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
