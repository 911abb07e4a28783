"""The order the suite's tests are handed out in on several processes (`make test`):
xdist's worksteal gives each process a contiguous share of the collection and an idle
process steals the end of the largest share left. A module that takes minutes (a
benchmark's chaos run, the local stack, a property test with a real worker) placed
anywhere but at the front of a share may start late and end the run alone. So each
share starts with its part of the long modules (by tests/module_durations.json, balanced
longest first), and the other tests follow in path order to fill the share. A pytest
plugin: pyproject's addopts load it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

# A module this long (seconds of wall time in a loaded `make test`) starts a share.
LONG_S = 15.0
# Beside the tests, under the run's root directory.
DURATIONS = Path("tests") / "module_durations.json"

Item = TypeVar("Item")


def share_sizes(total: int, workers: int) -> list[int]:
    """How many tests each process is handed first, as worksteal splits them."""
    sizes = []
    left = total
    for remaining in range(workers, 0, -1):
        size = left // remaining
        sizes.append(size)
        left -= size
    return sizes


def order(
    modules: Sequence[tuple[str, Sequence[Item]]],
    workers: int,
    seconds: Mapping[str, float],
    long_s: float = LONG_S,
) -> list[Item]:
    """The tests of `modules` (name, tests; in collection order), ordered so that each of
    the `workers` shares starts with long modules. A long module is kept whole; another
    module may be split where a share ends (its module fixtures then set up twice)."""
    flat = [item for _, items in modules for item in items]
    long = sorted(
        (m for m in modules if seconds.get(m[0], 0.0) >= long_s),
        key=lambda m: (-seconds[m[0]], m[0]),
    )
    if workers < 2 or not long:
        return flat
    sizes = share_sizes(len(flat), workers)
    # Longest first, each to the share with the least long work that still has room.
    assigned: list[list[tuple[str, Sequence[Item]]]] = [[] for _ in sizes]
    load = [0.0] * len(sizes)
    room = list(sizes)
    for module in long:
        fits = [i for i in range(len(sizes)) if room[i] >= len(module[1])] or range(len(sizes))
        share = min(fits, key=lambda i: (load[i], i))
        assigned[share].append(module)
        load[share] += seconds[module[0]]
        room[share] -= len(module[1])
    long_names = {name for name, _ in long}
    rest = [item for name, items in modules if name not in long_names for item in items]
    ordered: list[Item] = []
    end = 0
    for share, size in enumerate(sizes):
        end += size
        for _, items in assigned[share]:
            ordered.extend(items)
        take = max(0, end - len(ordered))
        ordered.extend(rest[:take])
        del rest[:take]
    ordered.extend(rest)
    return ordered


def read_durations(path: Path) -> dict[str, float]:
    """Module -> seconds, as `make test-cpu` wrote them; none when the file is missing."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    # A test process sees `--dist no`: it learns the controller's mode from it.
    node.workerinput["suite_order_dist"] = node.config.getoption("dist")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Last: after `-m` has deselected, so the shares counted are the ones handed out.
    workerinput = getattr(config, "workerinput", {})
    if workerinput.get("suite_order_dist") != "worksteal":
        return
    modules: list[tuple[str, list[pytest.Item]]] = []
    for item in items:
        name = item.nodeid.split("::", 1)[0]
        if modules and modules[-1][0] == name:
            modules[-1][1].append(item)
        else:
            modules.append((name, [item]))
    workers = int(workerinput["workercount"])
    items[:] = order(modules, workers, read_durations(config.rootpath / DURATIONS))
