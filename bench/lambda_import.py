"""Lambda cold import: `python -X importtime -c "import lambdas.<name>"` per handler module,
in a fresh interpreter each time (the best of three, so the page cache is warm as on a
reused Lambda host but no module is). Target ≤ 300 ms.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from agentq.local.workers import REPO_ROOT

TARGET_MS: Final = 300.0


def handler_modules(root: Path = REPO_ROOT / "lambdas") -> list[str]:
    names = []
    for path in sorted(root.iterdir()):
        if path.name.startswith("_"):
            continue
        if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
            names.append(f"lambdas.{path.stem}")
    return names


def import_ms(module: str) -> tuple[float, list[str]]:
    """Cumulative import time of `module` (ms), and its three heaviest direct imports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    env["POWERTOOLS_TRACE_DISABLED"] = "true"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"import {module} failed: {result.stderr[-500:]}")
    total: float | None = None
    direct: list[tuple[float, str]] = []
    for line in result.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name, micros = parts[2], int(parts[1].strip())
        if name.strip() == module:
            total = micros / 1000
        elif len(name) - len(name.lstrip()) == 3:  # one level below a top-level import
            direct.append((micros / 1000, name.strip()))
    if total is None:
        raise RuntimeError(f"no importtime line for {module}")
    heaviest = [f"{n} {ms:.0f}ms" for ms, n in sorted(direct, reverse=True)[:3]]
    return total, heaviest


def run(*, quick: bool = False) -> dict[str, Any]:
    repeat = 1 if quick else 3
    rows: list[dict[str, Any]] = []
    for module in handler_modules():
        try:
            samples = [import_ms(module) for _ in range(repeat)]
        except RuntimeError as exc:
            rows.append({"module": module, "error": str(exc)[:200]})
            continue
        best, heaviest = min(samples)
        rows.append({"module": module, "import_ms": round(best, 1),
                     "within_target": best <= TARGET_MS, "heaviest": heaviest})  # fmt: skip
    return {"target_ms": TARGET_MS, "modules": rows}
