"""A PENDING task's wait reason says how many tasks of its tier are queued ahead of it
(and how many of those are its tenant's), counted from the status index."""

from __future__ import annotations

import pytest
from conftest import Stack
from console_support import define

from agentq.client import AgentqClient
from agentq.store import queue_position as position_module
from agentq.store.queue_position import queue_position
from agentq.waits import explain_wait


def _ahead_by_records(client: AgentqClient, mine: str, tenant: str,
                      others: list[tuple[str, str]]) -> tuple[int, int]:  # fmt: skip
    """The expected counts from the STATE items themselves (their sort keys)."""
    own = client.get_task(mine, tenant=tenant).raw["statusSK"]
    before = [(rid, t) for rid, t in others
              if client.get_task(rid, tenant=t).raw["statusSK"] < own]  # fmt: skip
    return len(before), sum(1 for _, t in before if t == tenant)


def test_a_pending_task_says_how_many_of_its_tier_are_ahead(inproc_stack: Stack) -> None:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    me = client.settings.tenant_id
    normal: list[tuple[str, str]] = []
    for n, tenant in enumerate([me, "other", me, "other", me]):
        normal.append((client.submit("noop", {"n": n}, tenant=tenant).request_id, tenant))
    urgent = client.submit("noop", {"n": "urgent"}, priority="high").request_id
    last, _ = normal[-1]
    ahead, mine = _ahead_by_records(client, last, me, normal[:-1])
    # Submitted one after another: all four are ahead (unless two shared a millisecond).
    assert ahead >= 3

    reason = explain_wait(client, client.get_task(last, tenant=me))
    assert reason == f"queued: behind {ahead} task(s) of tier normal ({mine} of them tenant {me}'s)"
    # The high tier's task has nobody ahead of it in its own tier.
    assert explain_wait(client, client.get_task(urgent)) == (
        "queued: first in tier high, waiting for a free worker slot"
    )
    # A task that is no longer PENDING has no position.
    first, first_tenant = normal[0]
    client.cancel(first, tenant=first_tenant)
    record = client.get_task(first, tenant=first_tenant)
    assert queue_position(client.dynamodb, client.settings.required("table_name"), record,
                          default_tier="normal") is None  # fmt: skip
    # The cancelled one left the index: one fewer ahead.
    assert f"behind {ahead - 1} task(s)" in str(explain_wait(client, client.get_task(last)))


def test_the_count_is_bounded_and_says_so(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    ids = [client.submit("noop", {"n": n}).request_id for n in range(12)]
    monkeypatch.setattr(position_module, "MAX_COUNTED", 1)
    found = queue_position(client.dynamodb, client.settings.required("table_name"),
                           client.get_task(ids[-1]), default_tier="normal")  # fmt: skip
    assert found is not None and found.capped
    assert 1 <= found.ahead < 11
    assert "behind more than" in str(explain_wait(client, client.get_task(ids[-1])))
