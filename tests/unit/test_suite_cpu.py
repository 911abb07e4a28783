"""`make test-cpu`'s plugin and report (tools/suite_cpu.py): a child's CPU is charged to
the test that reaped it, the run's own line says what it spent, the report ranks files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools import suite_cpu

ROOT = Path(__file__).resolve().parents[2]

# A child that burns a fixed amount of CPU (not wall time), reaped by the test.
CASES = """
import subprocess, sys

BURN = "n = 0\\nfor i in range(6_000_000): n += i"


def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", BURN], check=True)


def test_idle():
    pass
"""


def test_a_childs_cpu_is_charged_to_the_test_that_reaped_it(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    profile = tmp_path / "cpu.jsonl"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.suite_cpu",
         "--cpu-profile", str(profile), "--rootdir", str(tmp_path), "-c", "/dev/null",
         str(tmp_path / "test_cases.py")],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    records = [json.loads(line) for line in profile.read_text().splitlines()]
    tests = {r["test"].rsplit("::", 1)[1]: r for r in records if "test" in r}
    assert set(tests) == {"test_burns_in_a_child", "test_idle"}
    burned = tests["test_burns_in_a_child"]["children"]
    assert burned > 0.1, records  # six million additions in another process
    assert tests["test_idle"]["children"] < burned / 10, records
    (run,) = [r["run"] for r in records if "run" in r]
    assert run >= burned

    assert tests["test_burns_in_a_child"]["wall"] > tests["test_idle"]["wall"], records

    durations = tmp_path / "durations.json"
    out = subprocess.run([sys.executable, "-m", "tools.suite_cpu", str(profile),
                          "--durations", str(durations)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(durations.read_text()) == {}  # no module took 5 s
    assert out.startswith("2 tests charged with ")
    assert "charged to no test" in out and "test_cases.py" in out


def test_the_report_ranks_directories_and_files_by_what_they_cost() -> None:
    lines = [
        json.dumps({"test": "tests/a/test_x.py::t1", "own": 1.0, "children": 2.0, "wall": 4.0}),
        json.dumps({"test": "tests/a/test_y.py::t2", "own": 0.5, "children": 0.0, "wall": 4.9}),
        json.dumps({"test": "tests/b/test_z.py::t3", "own": 4.0, "children": 0.0}),
        json.dumps({"test": "tests/a/test_x.py::t1", "own": 0.0, "children": 1.0, "wall": 2.6}),
        "",
        json.dumps({"run": 10.0}),
    ]
    profile = suite_cpu.Profile.read(lines)
    assert profile.by(1) == [("tests/a", 4.5), ("tests/b", 4.0)]
    assert profile.by(2)[0] == ("tests/a/test_x.py", 4.0)
    # Wall per module, for the suite's order (a line without one counts nothing).
    assert profile.module_walls(at_least_s=5.0) == {"tests/a/test_x.py": 7}
    text = suite_cpu.report(profile)
    assert "3 tests charged with 8 s of CPU" in text
    assert "charged to no test (each process's own moto, the run's start): 2 s" in text
    files = text.split("files, most CPU first:")[1].splitlines()[1:]
    assert [row.split()[-1] for row in files] == [
        "tests/a/test_x.py",
        "tests/b/test_z.py",
        "tests/a/test_y.py",
    ]


def test_an_unreadable_profile_is_one_line_and_exit_2(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "tools.suite_cpu", str(tmp_path / "none")],
                         cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.strip().startswith("cannot read ") and len(ran.stderr.splitlines()) == 1
