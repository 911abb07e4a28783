"""Scale-in protection against the ECS agent stand-in, on a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentq.local.ecs_agent import EcsAgentStandIn
from worker.protection import ScaleInProtection, read_answer


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent() -> Iterator[EcsAgentStandIn]:
    with EcsAgentStandIn() as stand_in:
        yield stand_in


def _protection(agent: EcsAgentStandIn, clock: Clock, retired: list[bool]) -> ScaleInProtection:
    return ScaleInProtection(agent.uri_for("t1"), max_protected_s=600, clock=clock,
                             on_retire=lambda: retired.append(True))  # fmt: skip


def test_the_agent_answer_is_read() -> None:
    ok = b'{"protection": {"ProtectionEnabled": true, "TaskArn": "a"}}'
    assert read_answer(200, ok, enabled=True).applied
    assert not read_answer(200, ok, enabled=False).applied
    failure = b'{"failure": {"Arn": "a", "Reason": "TASK_NOT_VALID", "Detail": null}}'
    assert read_answer(200, failure, enabled=True).detail == "HTTP 200, failure TASK_NOT_VALID"
    error = b'{"error": {"Code": "AccessDeniedException", "Message": "no"}}'
    assert "AccessDeniedException: no" in read_answer(400, error, enabled=True).detail
    assert not read_answer(502, b"<html>", enabled=True).applied
    assert not read_answer(200, b"{}", enabled=True).applied


def test_a_refused_change_is_retried_with_backoff_until_it_takes(agent: EcsAgentStandIn) -> None:
    clock, retired = Clock(), list[bool]()
    protection = _protection(agent, clock, retired)
    agent.fail_next("t1", 2, "error")
    protection.before_process(None)  # type: ignore[arg-type]
    assert not agent.protected("t1")
    protection.refresh()  # the backoff has not passed: nothing is sent
    assert len(agent.puts("t1")) == 1
    clock.now += 1.0  # the first retry waits the base delay
    protection.refresh()
    assert len(agent.puts("t1")) == 2 and not agent.protected("t1")
    clock.now += 2.0
    protection.refresh()
    assert agent.protected("t1")
    protection.after_process(None)  # type: ignore[arg-type]
    assert not agent.protected("t1")
    assert not retired


def test_protection_held_past_its_maximum_retires_the_worker_once(
    agent: EcsAgentStandIn,
) -> None:
    clock, retired = Clock(), list[bool]()
    protection = _protection(agent, clock, retired)
    protection.before_process(None)  # type: ignore[arg-type]
    clock.now += 599
    protection.refresh()
    assert not retired
    clock.now += 1
    protection.refresh()
    protection.refresh()
    assert retired == [True]
    assert agent.protected("t1"), "the running task keeps its protection"
    protection.after_process(None)  # type: ignore[arg-type]
    assert not agent.protected("t1")


def test_a_break_in_protection_starts_the_count_again(agent: EcsAgentStandIn) -> None:
    clock, retired = Clock(), list[bool]()
    protection = _protection(agent, clock, retired)
    protection.before_process(None)  # type: ignore[arg-type]
    clock.now += 500
    protection.after_process(None)  # type: ignore[arg-type]
    protection.before_process(None)  # type: ignore[arg-type]
    clock.now += 500
    protection.refresh()
    assert not retired


def test_protection_is_renewed_at_half_its_expiry(agent: EcsAgentStandIn) -> None:
    clock, retired = Clock(), list[bool]()
    protection = _protection(agent, clock, retired)
    protection.before_process(None)  # type: ignore[arg-type]
    clock.now += 30 * 60 + 1
    protection.refresh()
    assert [c["ProtectionEnabled"] for c in agent.puts("t1")] == [True, True]
