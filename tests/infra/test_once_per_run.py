"""The infra tests' run-wide set-up (tests/infra/once_per_run.py): processes racing for it
make it once and all read the same result; a failed attempt leaves it to the next."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from once_per_run import once_per_run

RACERS = 4


def _make_recording(made: Path) -> dict[str, int]:
    with made.open("a") as log:
        log.write(f"{os.getpid()}\n")
    return {"maker": os.getpid()}


def _race(shared: Path, start: multiprocessing.synchronize.Barrier, out: Path) -> None:
    start.wait(timeout=60)  # every racer asks at once
    result = once_per_run(
        shared, "thing", lambda: _make_recording(shared / "made.log"), json.dumps, json.loads
    )
    out.write_text(json.dumps(result))


def test_racing_processes_make_it_once_and_read_the_same_result(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(RACERS)
    outs = [tmp_path / f"out-{i}.json" for i in range(RACERS)]
    racers = [context.Process(target=_race, args=(tmp_path, start, out)) for out in outs]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=120)
        assert racer.exitcode == 0
    (maker,) = (tmp_path / "made.log").read_text().split()
    assert {out.read_text() for out in outs} == {json.dumps({"maker": int(maker)})}


def test_a_failed_make_leaves_it_to_the_next_asker(tmp_path: Path) -> None:
    def fail() -> str:
        raise RuntimeError("synth failed")

    with pytest.raises(RuntimeError, match="synth failed"):
        once_per_run(tmp_path, "thing", fail, str, str)
    assert once_per_run(tmp_path, "thing", lambda: "made", str, str) == "made"
    assert once_per_run(tmp_path, "thing", lambda: "again", str, str) == "made"


def test_a_run_of_one_process_makes_it_each_time_it_asks() -> None:
    asks = iter(["first", "second"])
    assert once_per_run(None, "thing", lambda: next(asks), str, str) == "first"
    assert once_per_run(None, "thing", lambda: next(asks), str, str) == "second"
