"""The local stack's health policy: a silent part is stalled until the limit, then dead."""

from __future__ import annotations

from agentq.local.health import Part, StackHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_missed_probe_is_a_stall_not_a_death_until_the_limit() -> None:
    clock, up = Clock(), {"moto": True}
    health = StackHealth([Part("moto", probe=lambda: up["moto"])], stall_limit_s=30, clock=clock)
    assert health.check().dead == []
    up["moto"] = False
    clock.now += 4
    report = health.check()
    assert report.dead == []
    assert [(s.name, s.silent_s) for s in report.stalled] == [("moto", 4)]
    clock.now += 25  # 29 s silent: still within the limit
    assert health.check().dead == []
    clock.now += 1
    report = health.check()
    assert report.dead == ["moto (no answer for 30 s)"]
    assert report.stalled == []


def test_a_part_that_answers_again_is_reported_recovered_and_its_silence_restarts() -> None:
    clock, up = Clock(), {"moto": False}
    health = StackHealth([Part("moto", probe=lambda: up["moto"])], stall_limit_s=30, clock=clock)
    clock.now += 20
    assert [s.name for s in health.check().stalled] == ["moto"]
    up["moto"] = True
    clock.now += 1
    report = health.check()
    assert report.recovered == ["moto"] and report.stalled == [] and report.dead == []
    assert health.check().recovered == []  # said once
    up["moto"] = False
    clock.now += 29  # 29 s after its last answer, not 50 s after the first miss
    assert health.check().dead == []


def test_an_exited_process_is_dead_at_once_whatever_its_probe_says() -> None:
    clock = Clock()
    gone = {"w": False}
    health = StackHealth(
        [Part("worker w", exited=lambda: gone["w"], probe=lambda: True)],
        stall_limit_s=30,
        clock=clock,
    )
    assert health.check().dead == []
    gone["w"] = True
    assert health.check().dead == ["worker w (its process exited)"]


def test_the_silence_counts_the_probe_s_own_wait() -> None:
    clock = Clock()

    def hanging_probe() -> bool:
        clock.now += 31  # a probe that hung for longer than the limit
        return False

    health = StackHealth([Part("moto", probe=hanging_probe)], stall_limit_s=30, clock=clock)
    assert health.check().dead == ["moto (no answer for 31 s)"]
