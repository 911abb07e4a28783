"""tools/warm_caches.py: the asserts rewritten ahead are the ones pytest then runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _pytest.assertion.rewrite import PYC_TAIL

from tools import warm_caches

FAILING = "def test_sum():\n    total = 1 + 1\n    assert total == 3\n"


def _pyc(module: Path) -> Path:
    return module.parent / "__pycache__" / (module.stem + PYC_TAIL)


def test_pytest_runs_the_rewritten_module_without_rewriting_it_again(tmp_path: Path) -> None:
    module = tmp_path / "test_sum.py"
    module.write_text(FAILING)
    assert warm_caches._rewrite([module]) == 1
    cached = _pyc(module).stat()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    # Introspection shows the rewritten code ran; an unchanged inode, that it was ours.
    assert "assert 2 == 3" in run.stdout, run.stdout
    after = _pyc(module).stat()
    assert (after.st_ino, after.st_mtime_ns) == (cached.st_ino, cached.st_mtime_ns)


def test_the_test_modules_are_the_ones_pytest_rewrites(tmp_path: Path) -> None:
    for name in ("test_a.py", "conftest.py", "sub/test_b.py", "support.py", "sub/a_test_c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in warm_caches.test_modules(tmp_path)]
    assert found == ["conftest.py", "sub/test_b.py", "test_a.py"]


def test_the_repository_is_rewritten_at_pytests_defaults() -> None:
    assert warm_caches.rewriting_supported() is None


def test_a_module_that_does_not_parse_is_left_to_pytest(tmp_path: Path) -> None:
    broken, good = tmp_path / "test_broken.py", tmp_path / "test_good.py"
    broken.write_text("def test_(:\n")
    good.write_text(FAILING)
    assert warm_caches._rewrite([broken, good]) == 1
    assert _pyc(good).exists() and not _pyc(broken).exists()
