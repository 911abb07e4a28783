"""How a chaos run waits: until every task is terminal (re-sending duplicates, and with
--faults unreadable copies of finished tasks, on the way, and sending more tasks while
the strike quotas lag), then until the local Lambda host has worked through its
backlog."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentq.local.lambda_host import LambdaHost
from agentq.states import TaskState
from agentq.store import keys
from bench.chaos_killer import Killer
from bench.chaos_model import Planned
from bench.stack import Stage

UNREADABLE_COPIES = 3


class SettleSettings(Protocol):
    """What settling reads of a run's `bench.chaos.ChaosConfig` (named here, not
    imported: chaos imports this module)."""

    @property
    def timeout_s(self) -> float: ...
    @property
    def stall_s(self) -> float: ...
    @property
    def faults(self) -> bool: ...
    @property
    def reconcile_lost_after_s(self) -> int: ...
    @property
    def reconcile_interval_s(self) -> float: ...
    @property
    def kill_until_done(self) -> float: ...


@dataclass
class Settled:
    """What settling sent besides the plan: the request ids of the unreadable copies,
    and the tasks added to keep work running until the strike quotas were met."""

    copies: list[str] = field(default_factory=list)
    top_ups: list[Planned] = field(default_factory=list)


def unreadable_copy(item: Planned) -> str:
    """A body no worker accepts (no definition, no input) that still names its task."""
    return json.dumps({"requestId": item.envelope.request_id, "tenant": item.envelope.tenant,
                       "unreadable": "a copy of a finished task no worker can parse"})  # fmt: skip


def settle(
    stage: Stage,
    planned: Sequence[Planned],
    duplicates: Sequence[Planned],
    killer: Killer,
    config: SettleSettings,
    began: float,
    *,
    top_up: Callable[[int], Sequence[Planned]] | None = None,
    busy_floor: int = 0,
) -> Settled:
    """Wait until every task is terminal; re-send duplicates once half are done.

    With --faults, also send an unreadable copy (a body no worker can parse, the
    task's request id as its attribute) of the first `UNREADABLE_COPIES` tasks that
    finished: a rejection must not end, or report an end of, a task that ended
    already (it re-sends the stored ending).

    Past `kill_until_done` with a strike quota unmet, the run would settle with the
    killer short of its quotas (a fast host finishes the plan in a few strikes), and a
    kill or freeze of an idle worker tests little: `top_up(n)` plans n more tasks, sent
    so that `busy_floor` tasks stay open until the quotas are met.
    """
    open_tasks = {p.envelope.request_id: p for p in planned}
    finished: list[Planned] = []
    settled = Settled()
    copied = settled.copies
    resent = False
    killing = True
    deadline = began + config.timeout_s
    progress_at = time.monotonic()
    while open_tasks:
        now = time.monotonic()
        if now > deadline:
            return settled  # verify reports every task that is not terminal
        # The reconciler needs its bounds and a run to repair a lost message or a job.
        stall_s = config.stall_s + (
            config.reconcile_lost_after_s + 3 * config.reconcile_interval_s if config.faults else 0
        )
        if not killing and now - progress_at > stall_s and stage.queue_counts() == (0, 0):
            # Nothing left to deliver: the open tasks are stuck (verify reports them).
            return settled
        for request_id in _terminal(stage, list(open_tasks.values())):
            finished.append(open_tasks.pop(request_id))
            progress_at = time.monotonic()
        if config.faults and len(copied) < UNREADABLE_COPIES:
            for item in finished[len(copied) : UNREADABLE_COPIES]:
                stage.send_raw(unreadable_copy(item), {"requestId": item.envelope.request_id})
                copied.append(item.envelope.request_id)
        # Agent tasks (seconds of CLI each, the run's stragglers) do not hold the killer
        # past `kill_until_done`: struck while the rest ran, they then finish in peace,
        # not under strikes aimed at nothing else until their attempts run out.
        counted = [p for p in planned if p.kind != "agent"]
        still = sum(1 for p in open_tasks.values() if p.kind != "agent")
        done = 1 - still / max(1, len(counted) + len(settled.top_ups))
        if not resent and done >= 0.5:
            # Copies of tasks that are finished, running or still queued.
            stage.send([p.envelope for p in duplicates])
            resent = True
        if killing and done >= config.kill_until_done:
            if killer.quota_met():
                killer.stop()
                killing = False
            elif top_up is not None and len(open_tasks) < busy_floor:
                extra = list(top_up(busy_floor - len(open_tasks)))
                stage.send([p.envelope for p in extra])
                open_tasks.update((p.envelope.request_id, p) for p in extra)
                settled.top_ups.extend(extra)
        time.sleep(1.0)
    if not resent:
        stage.send([p.envelope for p in duplicates])
    return settled


def _terminal(stage: Stage, items: Sequence[Planned]) -> list[str]:
    """Request ids whose STATE item is terminal: 100 per BatchGetItem, strongly consistent.

    moto's server runs one DynamoDB request at a time; polling item by item would
    starve the workers and the Lambda host and slow the very run it watches.
    """
    ddb, table = stage.clients["dynamodb"], stage.resources.table_name
    done = []
    for start in range(0, len(items), 100):
        keys_ = [{"PK": {"S": keys.task_pk(p.envelope.tenant, p.envelope.request_id)},
                  "SK": {"S": keys.STATE_SK}} for p in items[start : start + 100]]  # fmt: skip
        request = {table: {"Keys": keys_, "ConsistentRead": True,
                           "ProjectionExpression": "requestId, #s",
                           "ExpressionAttributeNames": {"#s": "state"}}}  # fmt: skip
        while request:
            response = ddb.batch_get_item(RequestItems=request)
            for item in response["Responses"].get(table, []):
                if TaskState(item["state"]["S"]).terminal:
                    done.append(item["requestId"]["S"])
            request = response.get("UnprocessedKeys") or {}
    return done


def wait_lambda_host(stage: Stage, host: LambdaHost, stall_s: float = 60.0) -> None:
    """Wait until the host has worked through the event and DLQ backlog.

    The host runs one handler at a time, so a big run leaves a long backlog (heartbeat
    events above all); give up only when it stops shrinking.
    """
    queues = [stage.resources.dlq_url, *stage.resources.target_queues.values()]
    last, progress_at = -1, time.monotonic()
    while time.monotonic() - progress_at < stall_s:
        left = sum(sum(stage.queue_counts(url)) for url in queues)
        if left == 0:
            return
        if left != last:
            last, progress_at = left, time.monotonic()
        time.sleep(0.5)
    raise TimeoutError(f"the local Lambda host stopped draining its queues ({last} left)")
