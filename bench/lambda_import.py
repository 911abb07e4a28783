"""Lambda cold import: `python -X importtime -c "import lambdas.<name>"` per handler module,
in a fresh interpreter each time (the best of three, so the page cache is warm as on a
reused Lambda host but no module is). Target ≤ 300 ms.

The task child's runner (`worker.child.runner`) is measured the same way: it starts once per
task, so its import is on every task's latency (no target; issue 19 took it back to
about 40 ms by keeping pydantic out).

The handlers import boto3 with their clients, on the first invocation, so the import
figure alone would flatter them: each row also reports "ready", the same interpreter's
import plus the handler's `warm()` (settings, boto3, the clients its first invocation
builds; no request is sent), under the environment a deployed function has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from agentq.config import env_name
from agentq.local.workers import REPO_ROOT

TARGET_MS: Final = 300.0

# What a deployed function's environment holds (names only: nothing is called). Static
# credentials as Lambda provides them, so no client goes looking for instance metadata.
_DEPLOYED_ENV: Final = {
    "AWS_REGION": "eu-west-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_SESSION_TOKEN": "bench",
    env_name("local"): "false",
    env_name("table_name"): "agentq-bench-events",
    env_name("definitions_table"): "agentq-bench-definitions",
    env_name("bus_name"): "agentq-bench",
    env_name("bucket"): "agentq-bench",
    env_name("queue_url"): "https://sqs.eu-west-1.amazonaws.com/123456789012/agentq-bench",
    env_name("dlq_url"): "https://sqs.eu-west-1.amazonaws.com/123456789012/agentq-bench-dlq",
    "POWERTOOLS_TRACE_DISABLED": "true",
}
_DROPPED_PREFIXES: Final = ("AWS_", "AGENTQ_", "SLACK_", "TASK_DEFINITIONS_")

_READY_MARK: Final = "agentq-bench-warm-ms="


def handler_modules(root: Path = REPO_ROOT / "lambdas") -> list[str]:
    names = []
    for path in sorted(root.iterdir()):
        if path.name.startswith("_"):
            continue
        if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
            names.append(f"lambdas.{path.stem}")
    return names


def deployed_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_PREFIXES)}
    env.update(_DEPLOYED_ENV)
    return env


CHILD_MODULE: Final = "worker.child.runner"


def measure(module: str, *, warm: bool = True) -> tuple[float, float, list[str]]:
    """Import time of `module` (ms), the same process's `warm()` time (ms; 0 without
    `warm`), and the three heaviest direct imports."""
    call = "m.warm()" if warm else "None"
    script = (
        f"import sys, time; import {module} as m; t = time.perf_counter(); {call}; "
        f"print('{_READY_MARK}' + repr((time.perf_counter() - t) * 1000))"
    )
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", script],
        capture_output=True, text=True, cwd=REPO_ROOT, env=deployed_env(), timeout=120,
        check=False,
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
        depth = len(name) - len(name.lstrip())
        if name.strip() == module:
            total = micros / 1000
        elif total is None and depth == 1:
            direct.clear()  # a child's line precedes its parent's: those were site's, say
        elif total is None and depth == 3:
            direct.append((micros / 1000, name.strip()))  # one level below the handler
    marks = [line for line in result.stdout.splitlines() if line.startswith(_READY_MARK)]
    if total is None or not marks:
        raise RuntimeError(f"no importtime line or warm time for {module}")
    heaviest = [f"{n} {ms:.0f}ms" for ms, n in sorted(direct, reverse=True)[:3]]
    return total, float(marks[-1].removeprefix(_READY_MARK)), heaviest


def import_ms(module: str) -> tuple[float, list[str]]:
    """Cumulative import time of `module` (ms), and its three heaviest direct imports."""
    total, _, heaviest = measure(module)
    return total, heaviest


def run(*, quick: bool = False) -> dict[str, Any]:
    repeat = 1 if quick else 3
    rows: list[dict[str, Any]] = []
    for module in handler_modules():
        try:
            samples = [measure(module) for _ in range(repeat)]
        except RuntimeError as exc:
            rows.append({"module": module, "error": str(exc)[:200]})
            continue
        best, _, heaviest = min(samples)
        ready = min(total + warm for total, warm, _ in samples)
        rows.append({"module": module, "import_ms": round(best, 1), "ready_ms": round(ready, 1),
                     "within_target": best <= TARGET_MS, "heaviest": heaviest})  # fmt: skip
    child_best, _, child_heaviest = min(measure(CHILD_MODULE, warm=False) for _ in range(repeat))
    child = {"module": CHILD_MODULE, "import_ms": round(child_best, 1),
             "heaviest": child_heaviest}  # fmt: skip
    return {"target_ms": TARGET_MS, "modules": rows, "child": child}
