"""docs/benchmarks.md stays a page a maintainer can trust.

It stays short and leads with one table of current figures; every rerun command in that
table names a benchmark, options and runs the code has; and every link of the page and
of docs/benchmarks/ leads to a file and heading that exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
PAGES = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
MAX_LINES = 300


def figures_table() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def bench_names() -> set[str]:
    """`python -m bench --only` accepts these (bench/__main__.py's NAMES)."""
    tree = ast.parse((ROOT / "bench" / "__main__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "NAMES" for t in targets):
                assert node.value is not None
                return set(ast.literal_eval(node.value))
    raise AssertionError("bench/__main__.py has no NAMES")


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.MULTILINE):
        plain = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
        anchors.add(plain.replace(" ", "-"))
    return anchors


def test_the_page_is_short_and_leads_with_the_figures() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(text.splitlines()) < MAX_LINES
    first_section = re.search(r"^## (.*)$", text, re.MULTILINE)
    assert first_section is not None and first_section.group(1) == "Current figures"
    assert len(figures_table()) >= 10
    assert (ROOT / "docs" / "benchmarks").is_dir()


def test_every_rerun_command_names_what_the_benchmarks_have() -> None:
    names = bench_names()
    for row in figures_table():
        command = row.rstrip(" |").rsplit("|", 1)[1].strip().strip("`")
        if command.startswith("python -X importtime"):
            module = command.split('"import ', 1)[1].rstrip('"')
            assert (ROOT / Path(*module.split("."))).with_suffix(".py").exists(), row
            continue
        words = command.split()
        assert words[:2] == ["python", "-m"] and words[2].startswith("bench"), row
        source = ROOT / Path(*words[2].split("."))
        source = source / "__main__.py" if source.is_dir() else source.with_suffix(".py")
        code = source.read_text(encoding="utf-8")
        options = [w for w in words[3:] if w.startswith("--")]
        for option in options:
            assert f'"{option}"' in code, f"{words[2]} has no option {option}: {row}"
        if "--only" in words:
            assert set(words[words.index("--only") + 1 :]) <= names, row
        if "--runs" in words:
            after = words[words.index("--runs") + 1 :]
            runs = after[: next((i for i, w in enumerate(after) if w.startswith("--")), None)]
            assert runs
            assert all(f'"{run}"' in code for run in runs), row


def test_every_link_of_the_benchmark_pages_resolves() -> None:
    broken = []
    for page in [DOC, *PAGES]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            missing = not destination.exists()
            if missing or (anchor and anchor not in heading_anchors(destination)):
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
