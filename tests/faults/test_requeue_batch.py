"""Requeued copies go out in batches (worker.sqs.batcher), against moto's server.

Many give-backs in one flush cost one `SendMessageBatch` and one `DeleteMessageBatch`.
Whatever SQS does to the batch, no task is lost: a copy that was not sent leaves its
original given back in place (one receive spent), never deleted, and a batch applied
but answered with an error leaves duplicate copies, which the task's lock settles.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from typing import Any

import pytest
from conftest import Stack
from fault_support import faulty_client, injector, rule
from hypothesis import given, settings
from hypothesis import strategies as st
from support import wait_for

from agentq.faults.config import FaultRule, Kind
from agentq.faults.injector import FaultInjector
from worker.sqs.batcher import MAX_BATCH, MAX_BATCH_BYTES, SqsBatcher, _chunks, _copy_size, _Item

pytestmark = pytest.mark.timeout(120)

HELD_S = 300  # a received message stays invisible this long unless given back


class Calls:
    """SQS requests made by a client, by operation (each attempt counted once)."""

    def __init__(self, client: Any) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        client.meta.events.register("before-call.sqs", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.counts[event_name.rsplit(".", 1)[-1]] += 1


def _fresh_queue(stack: Stack) -> str:
    url: str = stack.sqs.create_queue(QueueName=f"requeue-{uuid.uuid4().hex[:10]}")["QueueUrl"]
    return url


def _receive(stack: Stack, url: str, count: int) -> list[dict[str, Any]]:
    """`count` messages off the queue, held invisible."""
    found: dict[str, dict[str, Any]] = {}

    def more() -> bool:
        for message in stack.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=HELD_S,
            MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
        ).get("Messages", []):  # fmt: skip
            found[message["MessageId"]] = message
        return len(found) >= count

    wait_for(more, timeout=30, message=f"{count} messages on the queue")
    return list(found.values())


def _send(stack: Stack, url: str, bodies: list[str]) -> list[dict[str, Any]]:
    for body in bodies:
        stack.sqs.send_message(
            QueueUrl=url, MessageBody=body,
            MessageAttributes={"tenant": {"DataType": "String", "StringValue": "acme"}},
        )  # fmt: skip
    return _receive(stack, url, len(bodies))


def _counts(stack: Stack, url: str) -> tuple[int, int]:
    found = stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(found["ApproximateNumberOfMessages"]), int(
        found["ApproximateNumberOfMessagesNotVisible"]
    )


def _give_back_all(batcher: SqsBatcher, messages: list[dict[str, Any]]) -> None:
    for message in messages:
        batcher.give_back(message["ReceiptHandle"], message)
    assert batcher.flush(timeout_s=60)


def _give_back_through(
    stack: Stack, url: str, messages: list[dict[str, Any]], *faults: FaultRule
) -> tuple[FaultInjector, Calls]:
    """Give `messages` back in one flush, through a client of its own that meets
    `faults`: the injector, and the requests the client made."""
    injected = injector(*faults)
    client = faulty_client(stack, "sqs", injected)
    calls = Calls(client)
    # A long window: only the flush sends, so all of them are in one batch.
    batcher = SqsBatcher(client, url, delay_s=30)
    try:
        _give_back_all(batcher, messages)
    finally:
        batcher.close()
    return injected, calls


def test_many_give_backs_share_one_send_and_one_delete(stack: Stack) -> None:
    url = _fresh_queue(stack)
    originals = _send(stack, url, [f"task-{n}" for n in range(6)])
    _, calls = _give_back_through(stack, url, originals)
    assert calls.counts == {"SendMessageBatch": 1, "DeleteMessageBatch": 1}
    copies = _receive(stack, url, 6)
    assert sorted(c["Body"] for c in copies) == [f"task-{n}" for n in range(6)]
    by_original = {c["MessageAttributes"]["requeuedFrom"]["StringValue"]: c for c in copies}
    assert set(by_original) == {o["MessageId"] for o in originals}, "each a fresh copy"
    assert {c["Attributes"]["ApproximateReceiveCount"] for c in copies} == {"1"}
    assert all(c["MessageAttributes"]["tenant"]["StringValue"] == "acme" for c in copies)
    # The originals are deleted: nothing else is on the queue, visible or not.
    assert _counts(stack, url) == (0, 6)


def test_a_copy_sqs_refuses_leaves_its_original_given_back_in_place(stack: Stack) -> None:
    url = _fresh_queue(stack)
    originals = _send(stack, url, [f"task-{n}" for n in range(6)])
    faults, _ = _give_back_through(
        stack, url, originals, rule("sqs:SendMessageBatch", Kind.PARTIAL_BATCH, limit=1)
    )
    assert faults.counts() == {"sqs:SendMessageBatch:partial_batch": 1}
    back = _receive(stack, url, 6)
    in_place = [m for m in back if "requeuedFrom" not in m["MessageAttributes"]]
    copies = [m for m in back if "requeuedFrom" in m["MessageAttributes"]]
    assert in_place and copies, "some copies refused, some sent"
    assert {m["MessageId"] for m in in_place} <= {o["MessageId"] for o in originals}
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in in_place} == {"2"}
    assert sorted(m["Body"] for m in back) == [f"task-{n}" for n in range(6)], "none lost"


def test_a_batch_that_fails_past_the_retries_gives_every_original_back_in_place(
    stack: Stack,
) -> None:
    url = _fresh_queue(stack)
    originals = _send(stack, url, [f"task-{n}" for n in range(3)])
    faults, _ = _give_back_through(
        stack, url, originals, rule("sqs:SendMessageBatch", Kind.SERVER_ERROR)
    )
    assert faults.counts()["sqs:SendMessageBatch:server_error"] >= 2  # botocore retried
    back = _receive(stack, url, 3)
    assert {m["MessageId"] for m in back} == {o["MessageId"] for o in originals}
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in back} == {"2"}


def test_a_batch_applied_then_answered_with_an_error_leaves_duplicates_never_a_loss(
    stack: Stack,
) -> None:
    url = _fresh_queue(stack)
    originals = _send(stack, url, [f"task-{n}" for n in range(3)])
    faults, _ = _give_back_through(
        stack, url, originals, rule("sqs:SendMessageBatch", Kind.APPLIED_THEN_FAILED, limit=1)
    )
    assert faults.counts() == {"sqs:SendMessageBatch:applied_then_failed": 1}
    back = _receive(stack, url, 6)  # botocore sent the batch again: two copies of each
    assert sorted(m["Body"] for m in back) == sorted([f"task-{n}" for n in range(3)] * 2)
    assert all("requeuedFrom" in m["MessageAttributes"] for m in back), "originals deleted"


def test_deletes_sqs_failed_on_its_side_are_sent_again_and_the_originals_go(
    stack: Stack,
) -> None:
    """A delete entry left failed would keep its original invisible for the queue's whole
    visibility timeout (15 minutes when nothing shortened it): the chaos run's finding."""
    url = _fresh_queue(stack)
    originals = _send(stack, url, [f"task-{n}" for n in range(6)])
    faults, calls = _give_back_through(
        stack, url, originals, rule("sqs:DeleteMessageBatch", Kind.PARTIAL_BATCH, limit=1)
    )
    assert faults.counts() == {"sqs:DeleteMessageBatch:partial_batch": 1}
    assert calls.counts == {"SendMessageBatch": 1, "DeleteMessageBatch": 2}
    assert _counts(stack, url) == (6, 0), "six copies, every original deleted"
    copies = _receive(stack, url, 6)
    assert all("requeuedFrom" in c["MessageAttributes"] for c in copies)


def test_a_delete_sqs_keeps_failing_is_given_up_after_three_sends(stack: Stack) -> None:
    url = _fresh_queue(stack)
    [original] = _send(stack, url, ["task-0"])
    faults, calls = _give_back_through(
        stack, url, [original], rule("sqs:DeleteMessageBatch", Kind.PARTIAL_BATCH)
    )
    assert faults.counts() == {"sqs:DeleteMessageBatch:partial_batch": 3}
    assert calls.counts == {"SendMessageBatch": 1, "DeleteMessageBatch": 3}
    # The copy is on the queue; the original waits out its visibility (a duplicate then).
    assert _counts(stack, url) == (1, 1)


def test_a_visibility_change_sqs_failed_on_its_side_is_sent_again(stack: Stack) -> None:
    url = _fresh_queue(stack)
    [message] = _send(stack, url, ["task-0"])
    faults = injector(rule("sqs:ChangeMessageVisibilityBatch", Kind.PARTIAL_BATCH, limit=1))
    batcher = SqsBatcher(faulty_client(stack, "sqs", faults), url, delay_s=30)
    try:
        batcher.change_visibility(message["ReceiptHandle"], 0)
        assert batcher.flush(timeout_s=60)
    finally:
        batcher.close()
    assert faults.counts() == {"sqs:ChangeMessageVisibilityBatch:partial_batch": 1}
    [back] = _receive(stack, url, 1)  # visible at once, not after HELD_S
    assert back["MessageId"] == message["MessageId"]


def test_a_visibility_change_refused_for_the_senders_fault_is_not_sent_again(
    stack: Stack,
) -> None:
    """Past SQS's 12-hour cap (the local stack enforces it, per entry): asking again
    would be refused again."""
    url = _fresh_queue(stack)
    [message] = _send(stack, url, ["task-0"])
    client = faulty_client(stack, "sqs", injector())
    calls = Calls(client)
    batcher = SqsBatcher(client, url, delay_s=30)
    try:
        done = batcher.change_visibility(message["ReceiptHandle"], 43_200)
        assert batcher.flush(timeout_s=60) and done.is_set()
    finally:
        batcher.close()
    assert calls.counts == {"ChangeMessageVisibilityBatch": 1}
    assert _counts(stack, url) == (0, 1)  # it keeps the visibility it had


def test_copies_too_large_for_one_batch_go_in_several(stack: Stack) -> None:
    """Nine copies of 120 KiB: more than SQS takes in one batch (moto checks 1 MiB)."""
    url = _fresh_queue(stack)
    bodies = [f"{n}" + "x" * 120 * 1024 for n in range(9)]
    originals = _send(stack, url, bodies)
    _, calls = _give_back_through(stack, url, originals)
    assert calls.counts["SendMessageBatch"] == 5  # two copies (240 KiB) a batch
    back = _receive(stack, url, 9)
    assert sorted(m["Body"] for m in back) == sorted(bodies)
    assert all("requeuedFrom" in m["MessageAttributes"] for m in back)


def _send_item(body_size: int, attribute_size: int) -> _Item:
    attributes = {"a": {"DataType": "String", "StringValue": "v" * attribute_size}}
    copy = {"MessageBody": "b" * body_size, "MessageAttributes": attributes, "DelaySeconds": 0}
    return _Item("send", f"r{uuid.uuid4().hex}", "queue", copy=copy)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 2_000)), min_size=0, max_size=40))
def test_chunks_keep_order_and_fit_a_batch(sizes: list[tuple[int, int]]) -> None:
    items = [_send_item(body, attribute) for body, attribute in sizes]
    groups = _chunks(items)
    assert [item for group in groups for item in group] == items
    for group in groups:
        assert 1 <= len(group) <= MAX_BATCH
        total = sum(_copy_size(item.copy or {}) for item in group)
        assert total <= MAX_BATCH_BYTES or len(group) == 1
    # Greedy: a group ends only where the next copy would not fit it.
    for group, following in itertools.pairwise(groups):
        total = sum(_copy_size(item.copy or {}) for item in group)
        nxt = _copy_size(following[0].copy or {})
        assert len(group) == MAX_BATCH or total + nxt > MAX_BATCH_BYTES


@pytest.mark.parametrize("kind", [Kind.SERVER_ERROR, Kind.APPLIED_THEN_FAILED])
def test_a_copy_sent_at_once_meets_the_same_faults_without_a_flush(
    stack: Stack, kind: Kind
) -> None:
    """A message passed on to the fleet (worker.receive.consumer) goes without the batch window.
    Its copy failing past the retries gives the original back in place, visible at once;
    applied then answered with an error, it leaves copies. Never a loss, and no flush."""
    url = _fresh_queue(stack)
    [original] = _send(stack, url, ["task-0"])
    limited = {} if kind is Kind.SERVER_ERROR else {"limit": 1}  # past the retries, or once
    faults = injector(rule("sqs:SendMessageBatch", kind, **limited))
    client = faulty_client(stack, "sqs", faults)
    batcher = SqsBatcher(client, url, delay_s=30)  # far longer than the waits below
    try:
        done = batcher.requeue(original, 0, at_once=True)
        assert done.wait(timeout=20), "sent without waiting out the window"
        back = _receive(stack, url, 1 if kind is Kind.SERVER_ERROR else 2)
    finally:
        batcher.close()
    assert faults.counts()[f"sqs:SendMessageBatch:{kind.value}"] >= 1
    assert {m["Body"] for m in back} == {"task-0"}
    if kind is Kind.SERVER_ERROR:
        assert back[0]["MessageId"] == original["MessageId"], "given back in place"
        assert back[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    else:  # botocore sent the batch again: two copies, the original deleted
        assert [m["MessageAttributes"]["requeuedFrom"]["StringValue"] for m in back] == [
            original["MessageId"]
        ] * 2
