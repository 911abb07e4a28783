"""Task definitions saved while workers run are found without a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentq.definitions import DEFINITION_SUFFIXES, DefinitionRegistry, load_directory
from agentq.definitions.watch import MISS_RECHECK_S, WatchedDirectories
from agentq.errors import InvalidInput


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(directory: Path, name: str, callable_: str = "agentq.samples:echo") -> None:
    (directory / f"{name}.yaml").write_text(
        f"name: {name}\nkind: python\nsettings: {{callable: '{callable_}'}}\n"
    )


def test_a_definition_saved_later_is_found_on_its_first_miss(tmp_path: Path) -> None:
    clock = Clock()
    _write(tmp_path, "first")
    watched = WatchedDirectories(
        [tmp_path], load_directory, DEFINITION_SUFFIXES, recheck_s=60, clock=clock
    )
    assert watched.get("later") is None
    _write(tmp_path, "later")
    clock.now += MISS_RECHECK_S  # a miss looks again at once, within the miss bound
    found = watched.get("later")
    assert found is not None and found.name == "later"
    assert watched.names() == {"first", "later"}


def test_misses_of_unknown_names_read_the_directory_at_most_every_bound(tmp_path: Path) -> None:
    clock = Clock()
    watched = WatchedDirectories(
        [tmp_path], load_directory, DEFINITION_SUFFIXES, recheck_s=60, clock=clock
    )
    _write(tmp_path, "later")
    assert watched.get("later") is None  # checked at start, the bound not yet passed
    clock.now += MISS_RECHECK_S
    assert watched.get("later") is not None


def test_an_edited_definition_is_seen_after_the_recheck_interval(tmp_path: Path) -> None:
    clock = Clock()
    _write(tmp_path, "task", "agentq.samples:echo")
    watched = WatchedDirectories(
        [tmp_path], load_directory, DEFINITION_SUFFIXES, recheck_s=2, clock=clock
    )
    _write(tmp_path, "task", "agentq.samples:noop_with_a_longer_name")
    clock.now += 1
    assert watched.get("task").settings["callable"] == "agentq.samples:echo"  # type: ignore[union-attr]
    clock.now += 1
    found = watched.get("task")
    assert found is not None and found.settings["callable"].endswith("noop_with_a_longer_name")


def test_a_half_written_file_keeps_the_last_good_definitions(tmp_path: Path) -> None:
    clock = Clock()
    _write(tmp_path, "task")
    watched = WatchedDirectories(
        [tmp_path], load_directory, DEFINITION_SUFFIXES, recheck_s=2, clock=clock
    )
    (tmp_path / "task.yaml").write_text("name: task\nkind: pyth")
    clock.now += 2
    assert watched.get("task") is not None  # the last good one
    _write(tmp_path, "task", "agentq.samples:sleep")
    clock.now += 2
    assert watched.get("task").settings["callable"] == "agentq.samples:sleep"  # type: ignore[union-attr]


def test_a_bad_directory_at_start_is_still_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: bad\nkind: nope\n")
    with pytest.raises(InvalidInput):
        DefinitionRegistry.from_sources(directories=[tmp_path])


def test_the_registry_finds_a_definition_saved_after_it_was_built(tmp_path: Path) -> None:
    registry = DefinitionRegistry.from_sources(directories=[tmp_path])
    assert "later" not in registry.names()
    _write(tmp_path, "later")
    # The real clock: a miss rechecks once the short miss bound has passed.
    from support import wait_for

    wait_for(lambda: "later" in {d for d in registry.names()} or _found(registry, "later"),
             timeout=10, message="the new definition")  # fmt: skip


def _found(registry: DefinitionRegistry, name: str) -> bool:
    try:
        registry.get(name)
    except Exception:
        return False
    return True
