"""Where the test suite's CPU goes: a pytest plugin and its report (`make test-cpu`).

With `-p tools.suite_cpu --cpu-profile FILE`, every test process appends one line per test
to FILE: its wall time, the CPU it spent itself and the CPU of the children it reaped
meanwhile (workers, CLIs, the local stack's processes), setup and teardown included; the
run's first process adds what the whole run spent. `python -m tools.suite_cpu FILE` prints
the directories and files that cost most, and what no test was charged with; with
`--durations OUT` it writes each long module's wall time for tools/suite_order.py.

A child is charged to the test that reaps it: one left to end by itself, or a module's
stack torn down as the next module starts, lands on a later test of the same process; a
server that lives as long as its test process (its moto) lands on none.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OPTION = "--cpu-profile"


def _cpu_s() -> tuple[float, float]:
    """(this process's CPU, its reaped children's CPU), seconds. Workers forked by the
    process's launcher (agentq.local.launcher) are the launcher's children: it reports
    their CPU as they end."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    launcher = sys.modules.get("agentq.local.launcher")
    forks = launcher.launched_cpu_s() if launcher is not None else 0.0
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + forks


def _append(path: str, record: dict[str, Any]) -> None:
    # One write of one line on an O_APPEND file: the processes' lines never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, default=None, metavar="FILE",
                     help="append each test's CPU (own and reaped children's) to FILE")  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = item.config.getoption(OPTION)
    if not path:
        yield
        return
    own, reaped = _cpu_s()
    started = time.monotonic()
    yield
    wall = time.monotonic() - started
    own_after, reaped_after = _cpu_s()
    _append(path, {"test": item.nodeid, "own": round(own_after - own, 3),
                   "children": round(reaped_after - reaped, 3), "wall": round(wall, 3)})  # fmt: skip


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.getoption(OPTION, default=None)
    if path and "PYTEST_XDIST_WORKER" not in os.environ:
        # The run's first process: its test processes have ended and been reaped by now.
        own, reaped = _cpu_s()
        _append(path, {"run": round(own + reaped, 3)})


@dataclass(frozen=True)
class Profile:
    by_test: dict[str, float]
    run_s: float | None  # what the whole run spent, when its line is there
    wall_by_test: dict[str, float]

    @classmethod
    def read(cls, lines: Iterable[str]) -> Profile:
        by_test: dict[str, float] = {}
        wall_by_test: dict[str, float] = {}
        run_s = None
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            if "run" in record:
                run_s = float(record["run"])
            else:
                test = str(record["test"])
                spent = float(record["own"]) + float(record["children"])
                by_test[test] = by_test.get(test, 0.0) + spent
                wall = float(record.get("wall", 0.0))
                wall_by_test[test] = wall_by_test.get(test, 0.0) + wall
        return cls(by_test=by_test, run_s=run_s, wall_by_test=wall_by_test)

    def by(self, depth: int) -> list[tuple[str, float]]:
        """CPU per path prefix, most first: depth 1 the directory under tests/, 2 the file."""
        totals: dict[str, float] = {}
        for test, cpu in self.by_test.items():
            prefix = "/".join(test.split("::", 1)[0].split("/")[: depth + 1])
            totals[prefix] = totals.get(prefix, 0.0) + cpu
        return sorted(totals.items(), key=lambda row: (-row[1], row[0]))

    def module_walls(self, at_least_s: float) -> dict[str, float]:
        """Wall seconds per test module, for the modules that took `at_least_s` or more."""
        totals: dict[str, float] = {}
        for test, wall in self.wall_by_test.items():
            module = test.split("::", 1)[0]
            totals[module] = totals.get(module, 0.0) + wall
        return {m: round(s) for m, s in sorted(totals.items()) if s >= at_least_s}


def report(profile: Profile, top: int = 25) -> str:
    charged = sum(profile.by_test.values())
    lines = [f"{len(profile.by_test)} tests charged with {charged:,.0f} s of CPU"]
    if profile.run_s is not None:
        lines.append(f"the whole run: {profile.run_s:,.0f} s; charged to no test (each "
                     f"process's own moto, the run's start): {profile.run_s - charged:,.0f} s")  # fmt: skip
    for title, depth in (("directories", 1), ("files", 2)):
        lines += ["", f"{title}, most CPU first:"]
        for name, cpu in profile.by(depth)[:top]:
            lines.append(f"{cpu:8.1f} s  {100 * cpu / max(charged, 1e-9):5.1f} %  {name}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.suite_cpu", description=__doc__)
    parser.add_argument("file", type=Path, help="what --cpu-profile wrote")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    parser.add_argument("--durations", type=Path, metavar="OUT",
                        help="write the wall time of each module that took 5 s or more")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        text = args.file.read_text()
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    profile = Profile.read(text.splitlines())
    print(report(profile, top=args.top))
    if args.durations is not None:
        walls = profile.module_walls(at_least_s=5.0)
        args.durations.write_text(json.dumps(walls, indent=1) + "\n")
        print(f"\n{len(walls)} modules' wall times written to {args.durations}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
