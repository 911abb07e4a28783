"""docs/architecture.md's map of the code matches the code.

Every package and module of the floors appears in the package map, nothing it lists is
missing from the tree, what it says infra imports is what infra imports, and every path
the map and "Where to change what" name exists. `python -m tools.package_map` rewrites
the generated parts when modules move.
"""

from __future__ import annotations

import re
from pathlib import Path

from tools import package_map

ROOT = package_map.ROOT
DOC = package_map.DOC
PATH_IN_BACKTICKS = re.compile(r"`((?:agentq|worker|lambdas|infra|bench|tests|docs)/[^`\s]*)`")


def map_rows() -> dict[str, list[str]]:
    """The package map as the document has it: package directory → names it lists."""
    text = DOC.read_text(encoding="utf-8")
    generated = text.split(package_map.BEGIN, 1)[1].split(package_map.END, 1)[0]
    rows: dict[str, list[str]] = {}
    for line in generated.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[-1])
    return rows


def maintained_sections() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## Map of the code") :]


def test_the_generated_parts_are_current() -> None:
    assert package_map.main(["--check"]) == 0, (
        "docs/architecture.md is stale: regenerate with `python -m tools.package_map`"
    )


def test_every_package_and_module_of_the_floors_appears_in_the_map() -> None:
    rows = map_rows()
    missing = []
    for top in package_map.PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            package = path.parent.relative_to(ROOT).as_posix() + "/"
            if path.name != "__init__.py" and path.stem not in rows.get(package, []):
                missing.append(path.relative_to(ROOT).as_posix())
            if package not in rows:
                missing.append(package)
    assert not sorted(set(missing)), f"not in the package map: {sorted(set(missing))}"


def test_the_map_lists_nothing_that_does_not_exist() -> None:
    absent = []
    for package, names in map_rows().items():
        for name in names:
            target = ROOT / package / (name if name.endswith("/") else f"{name}.py")
            if not target.exists():
                absent.append(f"{package}{name}")
    assert not absent, f"in the package map, not in the code: {absent}"


def test_what_infra_imports_from_agentq_is_what_the_document_says() -> None:
    text = DOC.read_text(encoding="utf-8")
    listed = text.split(package_map.INFRA_BEGIN, 1)[1].split(package_map.INFRA_END, 1)[0]
    documented = re.findall(r"- `([^`]+)`", listed)
    imported = set()
    for path in [*(ROOT / "infra").rglob("*.py"), ROOT / "app.py"]:
        source = path.read_text(encoding="utf-8")
        imported.update(re.findall(r"^\s*from (agentq[\w.]*) import", source, re.MULTILINE))
        imported.update(re.findall(r"^\s*import (agentq[\w.]*)", source, re.MULTILINE))
    assert documented == sorted(imported)


def test_every_path_the_map_and_where_to_change_name_exists() -> None:
    named = {m for m in PATH_IN_BACKTICKS.findall(maintained_sections()) if "<" not in m}
    absent = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert named, "the sections name no paths: the pattern no longer matches"
    assert not absent, f"docs/architecture.md names paths that do not exist: {absent}"


def test_where_to_change_what_covers_the_changes_maintainers_make() -> None:
    section = maintained_sections().split("## Where to change what", 1)[1]
    first_cells = [line.split("|")[1].strip() for line in section.splitlines() if "|" in line]
    for change in (
        "a task kind",
        "a setting",
        "scheduling",
        "tenant limits",
        "a Lambda",
        "a local AWS rule",
    ):
        assert any(cell.startswith(change) for cell in first_cells), change


def test_the_map_reads_a_moved_module_from_the_tree(tmp_path: Path) -> None:
    (tmp_path / "agentq" / "store").mkdir(parents=True)
    (tmp_path / "agentq" / "__init__.py").write_text('"""Ground floor."""\n')
    (tmp_path / "agentq" / "store" / "__init__.py").write_text('"""The table.\n\nMore."""\n')
    (tmp_path / "agentq" / "store" / "keys.py").write_text("")
    table = package_map.table(tmp_path)
    assert "| `agentq/` | Ground floor. | `store/` |" in table
    assert "| `agentq/store/` | The table. | `keys` |" in table
