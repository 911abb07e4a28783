"""Tenants on one tier: a limited tenant's flood keeps no other tenant's task waiting.

On a queue without fair queues (moto alone, an EventBridge-submitted task, a foreign
sender's message) a receive hands out the oldest messages first, so another tenant's
task may wait behind a flood of a tenant at its limit. The receiver must go on through
the flood while a slot is free, each flood message going back once per back-off.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import Stack
from support import settle_indexes, wait_for

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.local.workers import SAMPLE_DEFINITIONS
from agentq.store.tenants import TenantLimitStore
from worker.app import build
from worker.receive.placement import Held

FLOOD = 30


def _send(stack: Stack, tenant: str, count: int) -> None:
    for start in range(0, count, 10):
        envelopes = [TaskEnvelope(request_id=f"{tenant}-{start + n}", tenant=tenant,
                                  definition="sample-echo", input={})
                     for n in range(min(10, count - start))]  # fmt: skip
        stack.sqs.send_message_batch(
            QueueUrl=stack.resources.queue_url,
            Entries=[{"Id": str(n), "MessageBody": e.to_body(),
                      "MessageAttributes": e.message_attributes()}
                     for n, e in enumerate(envelopes)],
        )  # fmt: skip


@pytest.mark.timeout(120)
def test_a_flood_of_a_tenant_at_its_limit_keeps_no_free_slot_from_another_tenant(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive that all went back (its tenant parked full here) used to leave the tier
    alone for the back-off: the free slots idled while the quiet tenant's task waited
    behind the flood (issue 38: B's and C's p95 5-7 s on one tier). Now the quiet task is
    received within a pass through the flood, and each flood message went back once."""
    for key, value in {"WARM_CHILDREN": "false", "SQS_BATCH_WINDOW": "0",
                       "SQS_QUEUE_URLS": f"normal={stack.resources.queue_url}",
                       "MAX_CONCURRENT_CLAUDE": "2", "WAIT_TIME_SECONDS": "1",
                       "TENANT_CONCURRENCY_LIMIT": "0", "TENANT_LIMIT_BACKOFF": "600000",
                       "TASK_DEFINITIONS_DIR": str(SAMPLE_DEFINITIONS)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set("flood", 1)
    settle_indexes(stack)  # the worker reads the limits through the listing index
    consumer = build(Settings.from_env()).consumer
    # The flood's tenant is at its limit, its parked messages here first in line.
    monkeypatch.setattr(consumer._limited.seats, "full", lambda tenant: tenant == "flood")
    offered: list[str] = []

    def offer(held: Held, prepare: Any = None) -> bool:
        offered.append(held[1].message_id)
        return False  # taken by the test: nothing runs

    monkeypatch.setattr(consumer.slots, "offer", offer)
    _send(stack, "flood", FLOOD)
    _send(stack, "quiet", 1)  # behind the flood: moto hands out the oldest first
    consumer._receiving.start()
    try:
        wait_for(lambda: offered, timeout=60,
                 message=f"the quiet tenant's task received ({consumer.verdicts})")  # fmt: skip
        assert len(offered) == 1
        assert consumer.verdicts.get("tenant_limit") == FLOOD, "each flood message went back once"
    finally:
        consumer._stopping.set()
        consumer._receiving.join(by=time.monotonic() + 10)
        consumer._limited.shutdown()
        consumer._batcher.close()
        consumer._events.close()
