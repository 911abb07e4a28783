"""The reconciler at a large backlog: what a run costs, and how many runs reach a lost task.

`python -m bench.reconcile [--tasks N] [--page N] [--quick]`. moto in-process
(`mock_aws`): N PENDING tasks are batch-written straight into the events table, all of
them older than RECONCILE_LOST_AFTER and all waiting (a worker saw their message go
round lately: `waitSeenAt`, as for a tenant at its limit), and one more, the newest,
whose message is lost. The reconciler then runs, as of one moment, until it re-sends
that task. Per run: DynamoDB requests (the call counter), status-index items read
(each Query's `Count`), repairs and moto's seconds (not AWS's). Before the cursor a run
read the oldest 1,000 tasks of a state and never reached a task behind them.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.aws import CallCounter
from agentq.envelope import TaskEnvelope
from agentq.resources import STATUS_SHARDS, status_shard
from agentq.states import TaskState
from agentq.store import keys
from agentq.store.codec import to_item

DEFAULT_TASKS: Final = 100_000
QUICK_TASKS: Final = 10_000
BATCH: Final = 25  # BatchWriteItem's limit
LOST_AFTER_S: Final = 1800


@dataclass(frozen=True)
class BacklogTask:
    """A STATE item to write as TaskStore.create would, with `extra` attributes."""

    request_id: str
    due_ms: int
    tenant: str = "default"
    state: TaskState = TaskState.PENDING
    extra: Mapping[str, Any] = field(default_factory=dict)

    def item(self) -> dict[str, Any]:
        envelope = TaskEnvelope(request_id=self.request_id, tenant=self.tenant,
                                definition="noop", input={"n": 1})  # fmt: skip
        return {
            "PK": keys.task_pk(self.tenant, self.request_id),
            "SK": keys.STATE_SK,
            "requestId": self.request_id,
            "tenant": self.tenant,
            "definition": "noop",
            "state": self.state.value,
            "attempt": 0,
            "createdAt": self.due_ms,
            "updatedAt": self.due_ms,
            "envelope": envelope.to_dict(),
            "statusPK": keys.status_pk(self.state.value, self.request_id),
            "statusSK": keys.status_sk(self.due_ms, self.tenant, self.request_id),
            **self.extra,
        }


def write_backlog(dynamodb: Any, table: str, tasks: Iterable[BacklogTask]) -> int:
    """Batch-write the tasks' STATE items (unprocessed ones sent again); how many."""
    written = 0
    batch: list[dict[str, Any]] = []
    for task in tasks:
        batch.append({"PutRequest": {"Item": to_item(task.item())}})
        if len(batch) == BATCH:
            written += _write(dynamodb, table, batch)
            batch = []
    if batch:
        written += _write(dynamodb, table, batch)
    return written


def _write(dynamodb: Any, table: str, batch: list[dict[str, Any]]) -> int:
    requests = {table: batch}
    while requests:
        requests = dynamodb.batch_write_item(RequestItems=requests).get("UnprocessedItems") or {}
    return len(batch)


def per_partition(tasks: Sequence[BacklogTask]) -> Counter[int]:
    return Counter(status_shard(task.request_id) for task in tasks)


class ItemsRead:
    """Items the status index returned, summed over every Query of a client."""

    def __init__(self) -> None:
        self.items = 0

    def attach(self, client: Any) -> Any:
        client.meta.events.register("after-call.dynamodb.Query", self._count)
        return client

    def _count(self, parsed: Mapping[str, Any], **_: Any) -> None:
        self.items += int(parsed.get("Count", 0))


def run(
    *, tasks: int = DEFAULT_TASKS, page: int = 250, max_runs: int | None = None
) -> dict[str, Any]:
    from moto import mock_aws

    from agentq.client import AgentqClient
    from agentq.config import Settings
    from agentq.local.aws import local_session_clients, provision
    from agentq.reconcile import Reconciler
    from agentq.resources import ResourceNames
    from agentq.store.waiting import WAIT_SEEN_AT

    at = 1_800_000_000_000
    seen = {WAIT_SEEN_AT: at - 1_000}
    waiting = [
        BacklogTask(f"b{i:06d}-{uuid.uuid4().hex[:6]}", at - 7_200_000 + i, extra=seen)
        for i in range(tasks)
    ]
    lost = BacklogTask(f"lost-{uuid.uuid4().hex[:8]}", at - 7_200_000 + tasks)
    sizes = per_partition(waiting)
    largest = sizes[status_shard(lost.request_id)]
    saved = dict(os.environ)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        with mock_aws():
            clients = local_session_clients(None)
            resources = provision(clients, ResourceNames(stage=f"rc{uuid.uuid4().hex[:8]}"))
            os.environ.update(resources.env())
            began = time.monotonic()
            write_backlog(clients["dynamodb"], resources.table_name, [*waiting, lost])
            write_s = time.monotonic() - began
            calls = CallCounter()
            items = ItemsRead()
            ddb = items.attach(calls.attach(clients["dynamodb"]))
            settings = Settings.from_env().model_copy(
                update={"reconcile_lost_after_s": LOST_AFTER_S, "reconcile_page_size": page}
            )
            client = AgentqClient.from_env(settings)
            # The stalled-job pass reads through the client's own DynamoDB client.
            items.attach(calls.attach(client.tasks.tenant_limits().client))
            reconciler = Reconciler(settings=settings, tasks=client.tasks, jobs=client.jobs,
                                    dispatcher=client.dispatcher, publisher=client.publisher,
                                    dynamodb=ddb, sqs=clients["sqs"])  # fmt: skip
            limit = max_runs or math.ceil(largest / page) + 3
            runs: list[dict[str, Any]] = []
            repaired_in: int | None = None
            for number in range(1, limit + 1):
                before_calls, before_items = calls.total(), items.items
                started = time.monotonic()
                report = reconciler.run(at_ms=at)
                runs.append({
                    "requests": calls.total() - before_calls,
                    "items_read": items.items - before_items,
                    "repairs": len(report.repairs),
                    "seconds": round(time.monotonic() - started, 3),
                    "errors": len(report.errors),
                })  # fmt: skip
                if any(r.subject == lost.request_id for r in report.repairs):
                    repaired_in = number
                    break
    finally:
        os.environ.clear()
        os.environ.update(saved)
    requests = [r["requests"] for r in runs]
    read = [r["items_read"] for r in runs]
    return {
        "tasks": tasks + 1,
        "page": page,
        "partitions": 4 * STATUS_SHARDS,
        "largest_partition": largest,
        "write_seconds": round(write_s, 1),
        "runs": len(runs),
        "repaired_in_runs": repaired_in,
        "bound_runs": math.ceil(largest / page) + 1,
        "requests_per_run_max": max(requests),
        "requests_per_run_median": statistics.median(requests),
        "items_read_per_run_max": max(read),
        "repairs": sum(r["repairs"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "seconds_per_run_median": statistics.median(r["seconds"] for r in runs),
    }


def render(figures: Mapping[str, Any]) -> str:
    rows = [
        ("backlog (tasks in the status index, one lost)", f"{figures['tasks']:,}"),
        ("page (RECONCILE_PAGE_SIZE) x partitions", f"{figures['page']} x {figures['partitions']}"),
        ("largest partition holding the lost task", f"{figures['largest_partition']:,}"),
        ("runs until the lost task was re-sent", str(figures["repaired_in_runs"])),
        ("bound: ceil(partition / page) + 1", str(figures["bound_runs"])),
        ("DynamoDB requests per run (max / median)",
         f"{figures['requests_per_run_max']} / {figures['requests_per_run_median']}"),
        ("status-index items read per run (max)", f"{figures['items_read_per_run_max']:,}"),
        ("repairs (duplicates of waiting tasks: 0 expected + 1 lost)", str(figures["repairs"])),
        ("errors", str(figures["errors"])),
        ("moto seconds per run (median)", str(figures["seconds_per_run_median"])),
        ("seconds to write the backlog", str(figures["write_seconds"])),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def table(figures: Mapping[str, Any]) -> Any:
    """The figures as `python -m bench` prints every benchmark's (a rich Table)."""
    from rich.table import Table

    out = Table(title="reconciler at a large backlog", title_justify="left")
    out.add_column("figure", justify="left")
    out.add_column("value", justify="right")
    for line in render(figures).splitlines():
        name, _, value = line.rpartition("  ")
        out.add_row(name.strip(), value.strip())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile", description=__doc__)
    parser.add_argument(
        "--tasks", type=int, default=None, help=f"backlog (default {DEFAULT_TASKS:,})"
    )
    parser.add_argument("--page", type=int, default=250, help="RECONCILE_PAGE_SIZE (default 250)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TASKS:,} tasks")
    parser.add_argument("--runs", type=int, default=None, help="stop after this many runs")
    args = parser.parse_args(argv)
    tasks = args.tasks or (QUICK_TASKS if args.quick else DEFAULT_TASKS)
    figures = run(tasks=tasks, page=args.page, max_runs=args.runs)
    print(render(figures))
    return 0 if figures["repaired_in_runs"] is not None and figures["repairs"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
