"""The local stack's SQS fair queues (agentq.local.rules.fair_queues): a tenant with a
disproportionate share of the in-flight messages yields to quiet tenants on receive."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import moto.sqs.models as sqs_models
import pytest
from conftest import Stack

from agentq.errors import IncompatibleDependency
from agentq.local.rules import fair_queues
from agentq.local.rules.fair_queues import fair_order, noisy_tenants


def _queue(stack: Stack, *, fifo: bool = False) -> str:
    name = "fair-" + uuid.uuid4().hex[:10] + (".fifo" if fifo else "")
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"} if fifo else {}
    return str(stack.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def _send(stack: Stack, url: str, group: str | None, count: int) -> None:
    for start in range(0, count, 10):
        entries: list[dict[str, Any]] = [
            {"Id": str(i), "MessageBody": f"{group}-{start + i}",
             **({"MessageGroupId": group} if group else {})}
            for i in range(min(10, count - start))
        ]  # fmt: skip
        stack.sqs.send_message_batch(QueueUrl=url, Entries=entries)


def _receive(stack: Stack, url: str, count: int) -> list[str]:
    bodies: list[str] = []
    while len(bodies) < count:
        got = stack.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=min(10, count - len(bodies)),
            VisibilityTimeout=300, WaitTimeSeconds=0,
        ).get("Messages", [])  # fmt: skip
        if not got:
            break
        bodies += [message["Body"] for message in got]
    return bodies


def test_a_tenant_with_many_messages_in_flight_yields_to_quiet_tenants(stack: Stack) -> None:
    """AWS: more than 10 % of the in-flight messages and at least 30 of its own makes a
    tenant noisy; quiet tenants' messages are received first. moto alone hands out the
    oldest messages first, the noisy tenant's backlog before anything sent after it."""
    url = _queue(stack)
    _send(stack, url, "tenant-a", 60)
    assert len(_receive(stack, url, 35)) == 35  # tenant-a: 35 in flight, 25 waiting
    _send(stack, url, "tenant-b", 3)
    _send(stack, url, None, 2)  # no group: each a tenant of its own, quiet
    got = _receive(stack, url, 5)
    assert sorted(got) == ["None-0", "None-1", "tenant-b-0", "tenant-b-1", "tenant-b-2"]
    # With no quiet message waiting, the noisy tenant's are received as usual.
    assert _receive(stack, url, 1) == ["tenant-a-35"]


def test_among_noisy_tenants_the_one_with_fewest_in_flight_goes_first(stack: Stack) -> None:
    url = _queue(stack)
    _send(stack, url, "tenant-a", 40)
    assert len(_receive(stack, url, 35)) == 35
    _send(stack, url, "tenant-b", 40)
    assert len(_receive(stack, url, 31)) == 31  # quiet until its 30th is in flight
    _send(stack, url, "tenant-c", 1)
    assert _receive(stack, url, 3) == ["tenant-c-0", "tenant-b-31", "tenant-b-32"]


def test_a_fifo_queue_keeps_its_order(stack: Stack) -> None:
    url = _queue(stack, fifo=True)
    for group in ("tenant-a", "tenant-b"):
        _send(stack, url, group, 2)
    assert _receive(stack, url, 4)[0] == "tenant-a-0"


def _message(group: str | None, received_at: float | None = None) -> Any:
    return SimpleNamespace(group_id=group, **(
        {"agentq_received_at": received_at} if received_at is not None else {}))  # fmt: skip


def test_a_tenant_long_in_flight_is_noisy_by_its_processing_time() -> None:
    """AWS's second measure: a tenant whose share of consumers' processing time exceeds
    10 % is noisy with few messages in flight."""
    slow = _message("slow", received_at=0.0)
    quick = [_message(f"quick-{i}", received_at=99.9) for i in range(20)]
    assert noisy_tenants([slow, *quick], now=100.0) == {"slow": 1}
    waiting = [_message("quick-0"), _message("slow"), _message("fresh")]
    assert [m.group_id for m in fair_order(waiting, {"slow": 1})] == ["quick-0", "fresh", "slow"]


def test_the_rule_refuses_a_moto_whose_receive_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqs_models.Queue, "messages", property(lambda self: []))
    with pytest.raises(IncompatibleDependency, match=r"Queue\.messages"):
        fair_queues.install()
