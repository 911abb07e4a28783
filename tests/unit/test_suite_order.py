"""The suite's order on several processes (tools/suite_order.py): every process's share
starts with long modules, no test is lost or repeated, and real xdist hands them out so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tools import suite_order

ROOT = Path(__file__).resolve().parents[2]


def _modules(sizes: list[int]) -> list[tuple[str, list[str]]]:
    return [(f"m{i}", [f"m{i}::t{j}" for j in range(n)]) for i, n in enumerate(sizes)]


@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=30),
    long_seconds=st.lists(st.floats(0, 300), max_size=30),
    workers=st.integers(1, 9),
)
def test_every_test_is_kept_once_long_modules_whole_and_the_rest_in_order(
    sizes: list[int], long_seconds: list[float], workers: int
) -> None:
    modules = _modules(sizes)
    seconds = {f"m{i}": s for i, s in enumerate(long_seconds)}
    ordered = suite_order.order(modules, workers, seconds)
    flat = [t for _, tests in modules for t in tests]
    assert sorted(ordered) == sorted(flat)
    long = {m for m, s in seconds.items() if s >= suite_order.LONG_S and m in dict(modules)}
    for name, tests in modules:
        if name in long:
            start = ordered.index(tests[0])
            assert ordered[start : start + len(tests)] == tests
    rest = [t for t in ordered if t.split("::")[0] not in long]
    assert rest == [t for t in flat if t.split("::")[0] not in long]


def test_each_share_starts_with_a_long_module_the_longest_spread_first() -> None:
    modules = _modules([3] * 12)  # 36 tests, three shares of 12
    seconds = {"m2": 100.0, "m5": 90.0, "m7": 80.0, "m9": 20.0, "m11": 1.0}
    ordered = suite_order.order(modules, 3, seconds)
    assert suite_order.share_sizes(36, 3) == [12, 12, 12]
    starts = [ordered[i].split("::")[0] for i in (0, 12, 24)]
    assert starts == ["m2", "m5", "m7"]
    # The fourth long module joins the share with the least long work (m7's).
    assert ordered[27].startswith("m9::")
    # One process: the collection's order.
    assert suite_order.order(modules, 1, seconds) == [t for _, ts in modules for t in ts]


def test_a_missing_or_malformed_durations_file_orders_nothing(tmp_path: Path) -> None:
    assert suite_order.read_durations(tmp_path / "none.json") == {}
    for text in ("not json", "[1, 2]", '{"tests/a.py": "long"}'):
        (tmp_path / "d.json").write_text(text)
        assert suite_order.read_durations(tmp_path / "d.json") == {}
    (tmp_path / "d.json").write_text('{"tests/a.py": 20, "tests/b.py": 7.5}')
    assert suite_order.read_durations(tmp_path / "d.json") == {
        "tests/a.py": 20.0,
        "tests/b.py": 7.5,
    }


def test_share_sizes_split_as_worksteal_does() -> None:
    assert suite_order.share_sizes(10, 3) == [3, 3, 4]
    assert suite_order.share_sizes(2, 4) == [0, 0, 1, 1]
    assert sum(suite_order.share_sizes(1714, 8)) == 1714


CONFTEST = """
import os

def pytest_runtest_setup(item):
    with open(os.environ["FIRST_SEEN"], "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {item.nodeid}\\n")
"""


def test_xdist_hands_each_process_a_long_module_first(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    for name in ("a", "b", "c", "d", "e", "f"):
        cases = "\n".join(f"def test_{i}():\n    pass\n" for i in range(8))
        (tests / f"test_{name}.py").write_text(cases)
    # The long ones are last in path order: without the plugin they would run last.
    durations = {"tests/test_e.py": 60, "tests/test_f.py": 50, "tests/test_d.py": 40}
    (tests / "module_durations.json").write_text(json.dumps(durations))
    seen = tmp_path / "seen.txt"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.suite_order",
         "-n", "3", "--dist", "worksteal", "--rootdir", str(tmp_path), "-c", "/dev/null", "tests"],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FIRST_SEEN": str(seen)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    first: dict[str, str] = {}  # each process appends its own lines in the order it ran them
    for line in seen.read_text().splitlines():
        worker, nodeid = line.split(" ", 1)
        first.setdefault(worker, nodeid)
    assert sorted(n.split("::")[0] for n in first.values()) == [
        "tests/test_d.py",
        "tests/test_e.py",
        "tests/test_f.py",
    ], first
