"""Every Python module of the project, tests and benchmarks included, reads in one sitting."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def tracked_python_files() -> list[Path]:
    # Tracked files only: a virtualenv, node_modules or a scratch file is not the project.
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [REPO / name for name in listed.decode().split("\0") if name]


def test_every_module_is_under_the_line_limit() -> None:
    files = [path for path in tracked_python_files() if path.is_file()]
    assert len(files) > 300  # the listing found the project, not an empty tree
    too_long = {
        str(path.relative_to(REPO)): lines
        for path in files
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) >= MAX_LINES
    }
    assert not too_long, f"split these modules (limit {MAX_LINES} lines): {too_long}"
