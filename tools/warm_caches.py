"""The bytecode every test process reads, written once before `make test` starts them.

On a fresh clone the test processes start together, and each would compile agentq and
rewrite every test module's asserts (about 4.5 s of CPU a process) before any had
written the caches the others read: this writes both first, on every core. The rewrite
uses pytest's private `_pytest.assertion.rewrite`; when that moves, this says so and
leaves the rewriting to the test processes (pytest checks each cache against its source's
hash, so a stale one is never run).

    python -m tools.warm_caches
"""

from __future__ import annotations

import compileall
import os
import re
import sys
import tomllib
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agentq", "worker", "lambdas", "infra", "bench", "tools", "definitions", "tests")
TEST_MODULE = re.compile(r"(^|/)(test_[^/]*|conftest)\.py$")


def test_modules(tests: Path) -> list[Path]:
    """The files pytest rewrites: `test_*.py` and `conftest.py` (it would also rewrite
    `*_test.py`, of which agentq has none; pyproject registers no other module)."""
    return sorted(p for p in tests.rglob("*.py") if TEST_MODULE.search(p.as_posix()))


def _rewrite(paths: Iterable[Path]) -> int:
    from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, get_cache_dir

    class _Quiet:  # the state `_write_pyc` traces its failures to
        trace = staticmethod(lambda message: None)

    written = 0
    for path in paths:
        cache = get_cache_dir(path)
        try:
            cache.mkdir(parents=True, exist_ok=True)  # as pytest makes it (a pycache_prefix too)
            source_hash, code = _rewrite_test(path, None)  # type: ignore[arg-type]
        except (OSError, SyntaxError, ValueError):
            continue  # pytest meets it again, and says what is wrong in the test's place
        written += _write_pyc(_Quiet(), code, source_hash, cache / (path.name[:-3] + PYC_TAIL))  # type: ignore[arg-type]
    return written


def rewriting_supported() -> str | None:
    """Why the asserts cannot be rewritten ahead here, or None."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return "pytest is not installed"
    missing = [
        n
        for n in ("PYC_TAIL", "_rewrite_test", "_write_pyc", "get_cache_dir")
        if not hasattr(rewrite, n)
    ]
    if missing:
        return f"pytest's private {', '.join(missing)} moved"
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    if options.get("enable_assertion_pass_hook") or "python_files" in options:
        return "pyproject.toml configures the rewriting this tool leaves at pytest's defaults"
    return None


def main() -> int:
    if sys.dont_write_bytecode:
        print("warm_caches: bytecode writing is off (PYTHONDONTWRITEBYTECODE): nothing to warm")
        return 0
    cores = len(os.sched_getaffinity(0))
    for package in PACKAGES:
        # Test modules get pytest's own rewritten bytecode below, not a plain one.
        compileall.compile_dir(REPO / package, quiet=1, workers=cores, rx=TEST_MODULE)
    reason = rewriting_supported()
    if reason:
        print(f"warm_caches: asserts not rewritten ahead ({reason})")
        return 0
    modules = test_modules(REPO / "tests")
    with ProcessPoolExecutor(cores) as pool:
        written = sum(pool.map(_rewrite, [modules[i::cores] for i in range(cores)]))
    print(f"warm_caches: agentq compiled, {written} of {len(modules)} test modules rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
