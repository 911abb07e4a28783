"""The package floors hold: no import circle, and nothing imports from a floor above.

agentq is the ground floor; worker, lambdas and infra stand on it side by side (none
imports another); bench stands on all of them. Imports are read with `ast`, so an
import inside a function or under TYPE_CHECKING counts as much as one at the top: a
lazy import still couples the packages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOORS = {"agentq": 0, "worker": 1, "lambdas": 1, "infra": 1, "bench": 2}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every module name `module` imports, relative imports resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            # `from pkg import sub` may import a submodule: count it when it is one.
            yield from (f"{target}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    sources = {
        module_name(path): path
        for package in FLOORS
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    edges: dict[str, set[str]] = {}
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = imported(tree, name, path.name == "__init__.py")
        edges[name] = {t for t in targets if t in sources and t != name}
    return edges


def test_no_package_imports_from_a_floor_above_or_beside_it() -> None:
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in graph().items()
        for target in targets
        if (low := source.split(".")[0]) != (high := target.split(".")[0])
        and FLOORS[high] >= FLOORS[low]
    )
    assert wrong == []


def test_what_is_deployed_never_imports_the_local_emulation() -> None:
    # The worker, the Lambdas and the CDK app run on AWS; agentq.local (moto, the local
    # IAM, the stand-ins) is for laptops and tests, and only the CLI's `local` and
    # `demo` commands reach it.
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in graph().items()
        if source.split(".")[0] in ("worker", "lambdas", "infra")
        for target in targets
        if target == "agentq.local" or target.startswith("agentq.local.")
    )
    assert wrong == []


def test_no_import_circle() -> None:
    edges = graph()
    # A package's __init__ importing its own submodules is how packages re-export,
    # not a circle between peers; leave those edges out.
    acyclic = {
        source: {t for t in targets if not t.startswith(f"{source}.")}
        for source, targets in edges.items()
    }
    try:
        tuple(TopologicalSorter(acyclic).static_order())
    except CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from exc


def test_the_checker_sees_a_lazy_upward_import_and_a_circle() -> None:
    # The checks above pass only if the reader finds imports wherever they are.
    tree = ast.parse(
        "def f():\n    from worker.app import main\nif TYPE_CHECKING:\n    from . import sibling\n"
    )
    found = set(imported(tree, "agentq.cli.worker", is_package=False))
    assert {"worker.app", "worker.app.main", "agentq.cli", "agentq.cli.sibling"} <= found
    sorter = TopologicalSorter({"a": {"b"}, "b": {"a"}})
    try:
        tuple(sorter.static_order())
    except CycleError:
        return
    raise AssertionError("a circle went unnoticed")
