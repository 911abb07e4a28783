"""The reconciler reaches every lost task, however many older waiting ones lie before it.

Backlogs are batch-written straight into moto's table (bench.reconcile.write_backlog)
and the reconciler runs as of a fixed moment (`at_ms`), with a small page
(RECONCILE_PAGE_SIZE) so a thousand-task backlog takes several runs to pass: the
cursor must move through it, wrap, and cost no more than its page a run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Stack
from jobs_support import client_for, drain

from agentq.aws import CallCounter
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.reconcile import Reconciler
from agentq.reconcile.cursor import CURSOR_PK
from agentq.resources import STATUS_SHARDS, status_shard
from agentq.states import TaskState
from agentq.store import keys
from agentq.store.waiting import WAIT_SEEN_AT
from bench.reconcile import BacklogTask, ItemsRead, write_backlog

pytestmark = pytest.mark.timeout(300)

AT = 1_800_000_000_000  # the moment every run is made as of
LOST_AFTER_S = 600
PAGE = 40
WATCHED_PARTITIONS = 4 * STATUS_SHARDS  # PENDING, SCHEDULED, RETRYING, PROCESSING


def sweeper(client: AgentqClient, dynamodb: Any, sqs: Any, *, page: int = PAGE) -> Reconciler:
    settings = Settings.from_env().model_copy(
        update={"reconcile_lost_after_s": LOST_AFTER_S, "reconcile_page_size": page}
    )
    return Reconciler(settings=settings, tasks=client.tasks, jobs=client.jobs,
                      dispatcher=client.dispatcher, publisher=client.publisher,
                      dynamodb=dynamodb, sqs=sqs)  # fmt: skip


def older_waiting(count: int, *, repaired_lately: bool = False) -> list[BacklogTask]:
    """`count` PENDING tasks due two hours before AT, oldest first: each either marked
    waiting a minute ago or repaired a minute ago, so none is lost as of AT."""
    mark = "repairedAt" if repaired_lately else WAIT_SEEN_AT
    return [BacklogTask(f"old-{i:05d}", AT - 7_200_000 + i, extra={mark: AT - 60_000})
            for i in range(count)]  # fmt: skip


def runs_until(reconciler: Reconciler, request_id: str, limit: int) -> Iterator[list[str]]:
    """The subjects each run repaired, until one repaired `request_id` (at most `limit`)."""
    for _ in range(limit):
        subjects = [r.subject for r in reconciler.run(at_ms=AT).repairs]
        yield subjects
        if request_id in subjects:
            return


def cursor_of(stack: Stack, partition: str) -> str | None:
    item = stack.dynamodb.get_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": CURSOR_PK}, "SK": {"S": partition}},
        ConsistentRead=True,
    ).get("Item", {})
    after = item.get("after", {}).get("S")
    return str(after) if after is not None else None


@pytest.mark.parametrize("repaired_lately", [False, True], ids=["marked-waiting", "repaired"])
def test_a_lost_task_behind_a_thousand_older_waiting_ones_is_re_sent_within_bounded_runs(
    inproc_stack: Stack, repaired_lately: bool
) -> None:
    stack = inproc_stack
    client = client_for(stack)
    backlog = older_waiting(1_200, repaired_lately=repaired_lately)
    lost = BacklogTask("lost-behind-them", AT - 3_600_000)  # newer than all, still lost
    write_backlog(stack.dynamodb, stack.resources.table_name, [*backlog, lost])
    shard = status_shard(lost.request_id)
    ahead = sum(1 for task in backlog if status_shard(task.request_id) == shard)
    assert ahead > PAGE, "the lost task's partition must take more than one page"
    bound = math.ceil(ahead / PAGE) + 1

    runs = list(runs_until(sweeper(client, stack.dynamodb, stack.sqs), lost.request_id, bound))

    assert runs[-1] == [lost.request_id], f"not re-sent within {bound} runs"
    assert all(subjects == [] for subjects in runs[:-1]), "a waiting task was re-sent"
    assert len(runs) >= math.ceil(ahead / PAGE), "reached sooner than a cursor could"
    assert [body["requestId"] for body in drain(stack)] == [lost.request_id]


def test_the_cursor_wraps_and_reaches_a_task_lost_behind_it(inproc_stack: Stack) -> None:
    stack = inproc_stack
    client = client_for(stack)
    backlog = older_waiting(400)
    write_backlog(stack.dynamodb, stack.resources.table_name, backlog)
    reconciler = sweeper(client, stack.dynamodb, stack.sqs)
    partition = keys.status_partition(TaskState.PENDING.value, status_shard(backlog[0].request_id))
    in_partition = sum(
        1 for t in backlog if status_shard(t.request_id) == status_shard(backlog[0].request_id)
    )
    assert in_partition > 2 * PAGE
    assert reconciler.run(at_ms=AT).repairs == []
    first_stop = cursor_of(stack, partition)
    assert first_stop is not None and first_stop > keys.status_sk(backlog[0].due_ms, "default",
                                                                 backlog[0].request_id)  # fmt: skip
    # The oldest task, already passed, loses its message now: its mark goes stale.
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": keys.task_pk("default", backlog[0].request_id)},
             "SK": {"S": keys.STATE_SK}},
        UpdateExpression=f"REMOVE {WAIT_SEEN_AT}",
    )  # fmt: skip
    bound = math.ceil(in_partition / PAGE) + 1

    runs = list(runs_until(reconciler, backlog[0].request_id, bound))

    assert runs[-1] == [backlog[0].request_id], f"not re-sent within {bound} more runs"
    assert len(runs) >= 2, "re-sent without the cursor going round"
    assert [body["requestId"] for body in drain(stack)] == [backlog[0].request_id]


def test_a_run_costs_its_page_however_large_the_backlog(inproc_stack: Stack) -> None:
    stack = inproc_stack
    client = client_for(stack)
    write_backlog(stack.dynamodb, stack.resources.table_name, older_waiting(1_200))
    calls = CallCounter()
    items = ItemsRead()
    dynamodb = items.attach(calls.attach(client.tasks.tenant_limits().client))
    reconciler = sweeper(client, dynamodb, stack.sqs)

    for _ in range(3):
        before_calls, before_items = calls.snapshot(), items.items
        assert reconciler.run(at_ms=AT).repairs == []
        after = calls.snapshot()
        spent = {op: after[op] - before_calls.get(op, 0) for op in after}
        # Each pass (lost messages; stalled jobs over the RUNNING-job and BLOCKED
        # partitions, empty here) reads its cursors in one BatchGetItem, then one page
        # query and at most one cursor move a partition.
        assert spent.get("dynamodb:BatchGetItem") == 2
        assert spent.get("dynamodb:Query", 0) <= WATCHED_PARTITIONS + 2 * STATUS_SHARDS
        assert spent.get("dynamodb:UpdateItem", 0) <= WATCHED_PARTITIONS + 2 * STATUS_SHARDS
        # The cursor's item at the page's start is read again, never more.
        assert items.items - before_items <= STATUS_SHARDS * (PAGE + 1)


class Interleaved:
    """A DynamoDB client that runs `meanwhile` once, on this run's first page query,
    between the run reading its cursors and moving them; or dies when the run goes to
    move the cursor of the partition `dies_at_cursor`, as a Lambda killed there would."""

    def __init__(self, client: Any, meanwhile: Any = None, *, dies_at_cursor: str = ""):
        self._client = client
        self._meanwhile = meanwhile
        self._dies = dies_at_cursor

    def query(self, **request: Any) -> Any:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return self._client.query(**request)

    def update_item(self, **request: Any) -> Any:
        if request["Key"]["PK"]["S"] == CURSOR_PK and request["Key"]["SK"]["S"] == self._dies:
            raise SystemExit("the run dies before it moves its cursor")
        return self._client.update_item(**request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_overlapping_runs_repair_once_and_never_move_the_cursor_back(
    inproc_stack: Stack,
) -> None:
    stack = inproc_stack
    client = client_for(stack)
    backlog = older_waiting(800)  # about 200 a partition: five pages
    lost = BacklogTask("lost-in-overlap", AT - 7_200_000 - 1)  # the oldest: first page
    write_backlog(stack.dynamodb, stack.resources.table_name, [*backlog, lost])
    partition = keys.status_partition(TaskState.PENDING.value, status_shard(lost.request_id))
    other = sweeper(client, stack.dynamodb, stack.sqs)
    repaired: list[str] = []

    def two_runs() -> None:
        for _ in range(2):
            repaired.extend(r.subject for r in other.run(at_ms=AT).repairs)

    overlapped = sweeper(client, Interleaved(stack.dynamodb, two_runs), stack.sqs)
    ahead = cursor_of(stack, partition)
    report = overlapped.run(at_ms=AT)
    # The other runs went two pages on; the overlapped run read the first page again
    # (its repair claimed by the other), and its move from the start was refused.
    two_pages_on = cursor_of(stack, partition)

    assert ahead is None and two_pages_on is not None
    assert repaired == [lost.request_id] and report.repairs == [] and not report.errors
    assert other.run(at_ms=AT).repairs == []
    after_next = cursor_of(stack, partition)
    assert after_next is None or after_next > two_pages_on  # on, or round to the start
    assert [body["requestId"] for body in drain(stack)] == [lost.request_id]
    assert client.tasks.require("default", lost.request_id).raw["repairs"] == 1


def test_a_run_that_dies_mid_page_leaves_the_page_to_the_next_without_duplicates(
    inproc_stack: Stack,
) -> None:
    stack = inproc_stack
    client = client_for(stack)
    backlog = older_waiting(300)
    lost = BacklogTask("lost-before-a-crash", AT - 7_200_000 - 1)
    write_backlog(stack.dynamodb, stack.resources.table_name, [*backlog, lost])
    partition = keys.status_partition(TaskState.PENDING.value, status_shard(lost.request_id))
    dying = sweeper(client, Interleaved(stack.dynamodb, dies_at_cursor=partition), stack.sqs)

    with pytest.raises(SystemExit):
        dying.run(at_ms=AT)
    assert cursor_of(stack, partition) is None  # never moved
    again = sweeper(client, stack.dynamodb, stack.sqs).run(at_ms=AT)

    assert again.repairs == [] and not again.errors  # its repair claimed, not repeated
    assert cursor_of(stack, partition) is not None  # and this time the cursor moved on
    assert [body["requestId"] for body in drain(stack)] == [lost.request_id]


def _refuse_inverted_between(params: dict[str, Any], **_: Any) -> None:
    """DynamoDB refuses `BETWEEN :a AND :b` with a > b (ValidationException); moto
    answers it with nothing, so the rule is checked on every request sent here."""
    condition = params.get("KeyConditionExpression", "")
    if "BETWEEN :after AND :bound" in condition:
        attrs = params["ExpressionAttributeValues"]
        assert attrs[":after"]["S"] <= attrs[":bound"]["S"], "AWS refuses this BETWEEN"


def test_a_cursor_past_a_bound_that_moved_back_starts_over(inproc_stack: Stack) -> None:
    """RECONCILE_LOST_AFTER raised (or a run as of an earlier moment): the cursor lies
    past the new bound, and the run starts from the oldest instead of asking DynamoDB
    for an inverted range."""
    stack = inproc_stack
    client = client_for(stack)
    backlog = older_waiting(400)
    lost = BacklogTask("lost-long-ago", AT - 7_200_000 - 1)
    write_backlog(stack.dynamodb, stack.resources.table_name, [*backlog, lost])
    stack.dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.Query", _refuse_inverted_between
    )
    reconciler = sweeper(client, stack.dynamodb, stack.sqs)
    assert [r.subject for r in reconciler.run(at_ms=AT).repairs] == [lost.request_id]
    partition = keys.status_partition(TaskState.PENDING.value, status_shard(lost.request_id))
    assert cursor_of(stack, partition) is not None
    drain(stack)

    # As of 1 h 50 min earlier the bound lies before every cursor: nothing is lost
    # yet (every task is younger than the bound), and each cursor goes back to the start.
    earlier = reconciler.run(at_ms=AT - 6_600_000)

    assert earlier.repairs == [] and not earlier.errors
    assert cursor_of(stack, partition) is None


def test_the_stalled_job_pass_reads_a_page_a_run_and_reaches_every_job(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 BLOCKED tasks, each of its own job (jobs created before job items entered the
    status index are found only so): each run reads at most a page of each BLOCKED and
    RUNNING-job partition, and every job is checked within ceil(N / page) + 1 runs."""
    stack = inproc_stack
    client = client_for(stack)
    blocked = [BacklogTask(f"blocked-{i:05d}", AT - 7_200_000 + i, state=TaskState.BLOCKED,
                           extra={"jobId": f"job-{i:05d}"}) for i in range(600)]  # fmt: skip
    write_backlog(stack.dynamodb, stack.resources.table_name, blocked)
    items = ItemsRead()
    reconciler = sweeper(client, items.attach(client.tasks.tenant_limits().client), stack.sqs)
    checked: list[str] = []

    def recording(tenant: str, job_id: str, bound: int) -> None:
        checked.append(job_id)

    monkeypatch.setattr(reconciler.jobs, "_check", recording)
    fullest = max(Counter(status_shard(task.request_id) for task in blocked).values())
    assert fullest > 2 * PAGE, "a partition must take several pages"

    for _ in range(math.ceil(fullest / PAGE) + 1):
        before_items, before_checked = items.items, len(checked)
        report = reconciler.run(at_ms=AT)
        assert report.repairs == [] and not report.errors
        # Pages of the BLOCKED partitions (the RUNNING-job ones and the watched task
        # states are empty), each with the cursor's own item read again.
        assert items.items - before_items <= STATUS_SHARDS * (PAGE + 1)
        assert len(checked) - before_checked <= STATUS_SHARDS * PAGE

    assert set(checked) == {task.extra["jobId"] for task in blocked}
