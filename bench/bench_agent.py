"""What agentq adds around one Claude CLI run, and what the child costs in memory.

Against the offline model server, it times

- a bare ``claude_agent_sdk.query()`` run inside this (warm) process: the minimal
  cost of one CLI run with structured output, and
- the same task as agentq runs it: ``python -m worker.child TASK_DIR`` (interpreter
  start, imports, definition and prompt, the SDK run, validation, trace and files), and
- the same task handed to a warm spare through the worker's own code path
  (`worker.child.supervisor.run_child` with a `worker.child.spares.SparePool`, WARM_CHILDREN=true):
  the clock starts at the hand-off; the spare warms while nothing else is measured.

agentq's overhead is the difference; it is split into *child start → SDK first message*
and *SDK result → child exit* (minus the same spans of the bare run), and compared with
the target of at most 15% of a minimal CLI run's wall time. The child's peak RSS (the
Python process alone, and with the CLI it starts) is sampled every 10 ms.

    python -m bench.bench_agent [--runs N] [--json bench/results/agent.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import anyio
import psutil

from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer

SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "points"],
    "properties": {
        "title": {"type": "string"},
        "points": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    },
}
PROMPT: Final = "Write a note about the text below.\n\n{text}"
TEXT: Final = "Queues decouple producers from workers; a dead-letter queue keeps poison messages."
TARGET_PCT: Final = 15.0


def _claude_env(base_url: str, home: Path) -> dict[str, str]:
    return offline_claude_env(base_url, home)


def _bare_run(env: dict[str, str], cwd: Path) -> dict[str, float]:
    """One minimal query(): the options agentq uses, none of its machinery."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

    options = ClaudeAgentOptions(
        tools=[],
        max_turns=4,
        permission_mode="dontAsk",
        system_prompt="Answer with the StructuredOutput tool.",
        output_format={"type": "json_schema", "schema": SCHEMA},
        setting_sources=[],
        cwd=str(cwd),
        env={**env, "CLAUDE_CODE_MAX_RETRIES": "0"},
    )
    marks: dict[str, float] = {}

    async def main() -> None:
        start = time.perf_counter()
        async for message in query(prompt=PROMPT.format(text=TEXT), options=options):
            marks.setdefault("first_message", time.perf_counter() - start)
            if isinstance(message, ResultMessage):
                marks["result"] = time.perf_counter() - start
        marks["wall"] = time.perf_counter() - start

    cpu, reaped = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    anyio.run(main)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    marks["cpu"] = time.process_time() - cpu
    marks["cli_cpu"] = (after.ru_utime + after.ru_stime) - (reaped.ru_utime + reaped.ru_stime)
    return {k: v * 1000 for k, v in marks.items()}


def _bare_fresh_run(env: dict[str, str], cwd: Path) -> dict[str, float]:
    """The same minimal query() in a fresh interpreter: what process isolation alone costs."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_agent", "--bare-once", str(cwd)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    marks: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    marks["wall"] = (time.perf_counter() - start) * 1000
    return marks


class _PeakRss:
    """Samples a process (alone, and with its descendants) until it exits."""

    def __init__(self, pid: int) -> None:
        self.own = 0
        self.tree = 0
        self.cpu_s = 0.0  # the Python process itself
        self.cli_cpu_s = 0.0  # descendants it has reaped (the CLI)
        self._proc = psutil.Process(pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            try:
                own = self._proc.memory_info().rss
                cpu = self._proc.cpu_times()
                self.cpu_s = cpu.user + cpu.system
                self.cli_cpu_s = cpu.children_user + cpu.children_system
                tree = own
                for child in self._proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        tree += child.memory_info().rss
            except psutil.Error:
                return
            self.own, self.tree = max(self.own, own), max(self.tree, tree)
            time.sleep(0.01)

    def join(self) -> None:
        self._thread.join(timeout=5)


def _child_run(env: dict[str, str], scratch: Path, index: int) -> dict[str, float]:
    task_dir = scratch / f"task-{index}"
    task_dir.mkdir()
    definition = {
        "name": "bench-note",
        "kind": "agent",
        "settings": {"prompt": PROMPT, "output_schema": SCHEMA, "max_turns": 4},
    }
    task = {"requestId": f"bench-{index}", "tenant": "bench", "attempt": 1, "jobId": None,
            "definition": definition, "input": {"text": TEXT}}  # fmt: skip
    (task_dir / "task.json").write_text(json.dumps(task))
    spawned = time.time()
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "worker.child", str(task_dir)],
        env={**env, "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path.cwd())},
        cwd=task_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rss = _PeakRss(child.pid)
    code = child.wait(timeout=180)
    wall = (time.perf_counter() - start) * 1000
    exited = time.time()
    rss.join()
    if code != 0:
        raise RuntimeError(f"child failed: {(task_dir / 'error.json').read_text()}")
    trace = json.loads((task_dir / "traces" / "session_trace.json").read_text())
    started = trace["started_unix"]  # AgentRun began (imports done, before the definition)
    timing = trace["timing_ms"]
    query_start = trace["attempts"][0]["started_ms"]
    return {
        "wall": wall,
        "interpreter_and_imports": (started - spawned) * 1000,
        "to_query": (started - spawned) * 1000 + query_start,
        "first_message": (started - spawned) * 1000 + timing["first_message"],
        "in_sdk": timing["result"] - query_start,
        "after_result": (exited - started) * 1000 - timing["result"],
        "result_to_files": timing["total"] - timing["result"],
        "cpu_ms": rss.cpu_s * 1000,
        "cli_cpu_ms": rss.cli_cpu_s * 1000,
        "peak_rss_mb": rss.own / 2**20,
        "peak_rss_tree_mb": rss.tree / 2**20,
    }


def _task_dir(scratch: Path, name: str) -> Path:
    task_dir = scratch / name
    task_dir.mkdir()
    definition = {
        "name": "bench-note",
        "kind": "agent",
        "settings": {"prompt": PROMPT, "output_schema": SCHEMA, "max_turns": 4},
    }
    task = {"requestId": name, "tenant": "bench", "attempt": 1, "jobId": None,
            "definition": definition, "input": {"text": TEXT}}  # fmt: skip
    (task_dir / "task.json").write_text(json.dumps(task))
    return task_dir


def _warm_child_run(env: dict[str, str], scratch: Path, index: int, pool: Any) -> dict[str, float]:
    """The task as the worker runs it with WARM_CHILDREN: handed to a warmed spare."""
    from worker.child.supervisor import StopSignal, run_child

    if not pool.wait_ready(180):
        raise RuntimeError("no warm spare got ready")
    task_dir = _task_dir(scratch, f"warm-{index}")
    handed = time.time()
    start = time.perf_counter()
    child = run_child(
        task_dir, env=env, timeout_s=180, grace_s=5, stop=StopSignal(),
        log_line=lambda stream, line: None, spares=pool,
    )  # fmt: skip
    wall = (time.perf_counter() - start) * 1000
    if child.returncode != 0 or not child.warm:
        raise RuntimeError(f"warm child failed (warm={child.warm}): {child.returncode}")
    trace = json.loads((task_dir / "traces" / "session_trace.json").read_text())
    began = (trace["started_unix"] - handed) * 1000
    return {"wall": wall, "first_message": began + trace["timing_ms"]["first_message"]}


def _forked_child_run(env: dict[str, str], scratch: Path, index: int) -> dict[str, float]:
    """The child forked from a process that already imported everything (a zygote):
    what the worker's per-task cost would be with a fork server."""
    from worker.child.runner import run as child_run

    task_dir = scratch / f"forked-{index}"
    task_dir.mkdir()
    definition = {
        "name": "bench-note",
        "kind": "agent",
        "settings": {"prompt": PROMPT, "output_schema": SCHEMA, "max_turns": 4},
    }
    task = {"requestId": f"fork-{index}", "tenant": "bench", "attempt": 1, "jobId": None,
            "definition": definition, "input": {"text": TEXT}}  # fmt: skip
    (task_dir / "task.json").write_text(json.dumps(task))
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child
        code = 1
        try:
            os.setsid()
            os.chdir(task_dir)
            os.environ.update(env)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = child_run(task_dir)
        finally:
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    wall = (time.perf_counter() - start) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"forked child failed: {(task_dir / 'error.json').read_text()}")
    # The child's CPU includes the CLI it reaped.
    return {"wall": wall, "cpu_with_cli": (usage.ru_utime + usage.ru_stime) * 1000}


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def run(runs: int = 3) -> dict[str, Any]:
    """Measure and print the table; returns the figures (milliseconds, MB, percent)."""
    scratch = Path(tempfile.mkdtemp(prefix="agentq-bench-agent-"))
    home = scratch / "home"
    home.mkdir()
    with ModelServer() as model:
        env = _claude_env(model.url, home)
        _bare_run(env, scratch)  # warm the CLI's config dir and the page cache
        import worker.kinds.agent.runner  # noqa: F401 - the zygote holds the imports
        from worker.child.spares import SparePool

        child_env = {**env, "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path.cwd())}
        pool = SparePool(env=child_env, size=1, cwd=home, warm_agent="always")
        pool.start()
        bare, fresh, child, forked, warm = [], [], [], [], []
        try:
            # Interleaved, so that each variant sees the same machine load; the warm run
            # goes last and waits for its spare first, so warming overlaps no measurement.
            for i in range(runs):
                pool.wait_ready(180)
                bare.append(_bare_run(env, scratch))
                fresh.append(_bare_fresh_run(env, scratch))
                child.append(_child_run(env, scratch, i))
                forked.append(_forked_child_run(env, scratch, i))
                warm.append(_warm_child_run(child_env, scratch, i, pool))
        finally:
            pool.close()
    bare_wall = _median(bare, "wall")
    fresh_wall = _median(fresh, "wall")
    child_wall = _median(child, "wall")
    overhead = child_wall - bare_wall
    figures: dict[str, Any] = {
        "runs": runs,
        "bare_wall_ms": bare_wall,
        "bare_first_message_ms": _median(bare, "first_message"),
        "bare_after_result_ms": _median(bare, "wall") - _median(bare, "result"),
        "child_wall_ms": child_wall,
        "child_interpreter_and_imports_ms": _median(child, "interpreter_and_imports"),
        "child_start_to_query_ms": _median(child, "to_query"),
        "child_start_to_first_message_ms": _median(child, "first_message"),
        "child_in_sdk_ms": _median(child, "in_sdk"),
        "child_result_to_exit_ms": _median(child, "after_result"),
        "child_result_to_files_written_ms": _median(child, "result_to_files"),
        "bare_fresh_process_wall_ms": fresh_wall,
        "isolation_ms": fresh_wall - bare_wall,
        "overhead_beyond_isolation_ms": child_wall - fresh_wall,
        "overhead_beyond_isolation_pct": 100 * (child_wall - fresh_wall) / bare_wall,
        "forked_child_wall_ms": _median(forked, "wall"),
        "forked_overhead_ms": _median(forked, "wall") - bare_wall,
        "forked_overhead_pct": 100 * (_median(forked, "wall") - bare_wall) / bare_wall,
        "warm_child_wall_ms": _median(warm, "wall"),
        "warm_start_to_first_message_ms": _median(warm, "first_message"),
        "warm_overhead_ms": _median(warm, "wall") - bare_wall,
        "warm_overhead_pct": 100 * (_median(warm, "wall") - bare_wall) / bare_wall,
        "overhead_ms": overhead,
        "overhead_pct": 100 * overhead / bare_wall,
        "target_pct": TARGET_PCT,
        "bare_python_cpu_ms": _median(bare, "cpu"),
        "bare_cli_cpu_ms": _median(bare, "cli_cpu"),
        "forked_cpu_with_cli_ms": _median(forked, "cpu_with_cli"),
        "forked_overhead_cpu_ms": _median(forked, "cpu_with_cli")
        - _median(bare, "cpu")
        - _median(bare, "cli_cpu"),
        "child_python_cpu_ms": _median(child, "cpu_ms"),
        "child_cli_cpu_ms": _median(child, "cli_cpu_ms"),
        "child_peak_rss_mb": max(r["peak_rss_mb"] for r in child),
        "child_with_cli_peak_rss_mb": max(r["peak_rss_tree_mb"] for r in child),
    }
    _print(figures)
    return figures


def _print(f: dict[str, Any]) -> None:
    rows = [
        ("minimal CLI run (bare query()), wall", f"{f['bare_wall_ms']:.0f} ms"),
        ("  query() → first message", f"{f['bare_first_message_ms']:.0f} ms"),
        ("  result → generator done", f"{f['bare_after_result_ms']:.0f} ms"),
        ("agentq child (python -m worker.child), wall", f"{f['child_wall_ms']:.0f} ms"),
        ("  child start → AgentRun (interpreter, imports)", f"{f['child_interpreter_and_imports_ms']:.0f} ms"),
        ("  child start → query() called", f"{f['child_start_to_query_ms']:.0f} ms"),
        ("  child start → SDK first message", f"{f['child_start_to_first_message_ms']:.0f} ms"),
        ("  inside the SDK (query → result)", f"{f['child_in_sdk_ms']:.0f} ms"),
        ("  SDK result → child exit", f"{f['child_result_to_exit_ms']:.0f} ms"),
        ("    of which SDK close, validation, trace", f"{f['child_result_to_files_written_ms']:.0f} ms"),
        ("bare query() in a fresh interpreter, wall", f"{f['bare_fresh_process_wall_ms']:.0f} ms"),
        ("  process isolation alone (fresh - in-process)", f"{f['isolation_ms']:.0f} ms"),
        ("agentq beyond isolation (child - fresh)", f"{f['overhead_beyond_isolation_ms']:.0f} ms = "
         f"{f['overhead_beyond_isolation_pct']:.1f}% of a minimal run"),
        ("agentq overhead (child - bare in-process)", f"{f['overhead_ms']:.0f} ms = {f['overhead_pct']:.1f}% "
         f"(target ≤ {f['target_pct']:.0f}%)"),
        ("child forked from a warm process (zygote), wall", f"{f['forked_child_wall_ms']:.0f} ms"),
        ("  overhead with a zygote (forked - bare)", f"{f['forked_overhead_ms']:.0f} ms = "
         f"{f['forked_overhead_pct']:.1f}% (target ≤ {f['target_pct']:.0f}%)"),
        ("warm spare via run_child (WARM_CHILDREN), wall", f"{f['warm_child_wall_ms']:.0f} ms"),
        ("  hand-off → SDK first message", f"{f['warm_start_to_first_message_ms']:.0f} ms"),
        ("  overhead with warm spares (warm - bare)", f"{f['warm_overhead_ms']:.0f} ms = "
         f"{f['warm_overhead_pct']:.1f}% (target ≤ {f['target_pct']:.0f}%)"),
        ("CPU, bare query(): Python side", f"{f['bare_python_cpu_ms']:.0f} ms"),
        ("CPU, bare query(): the CLI", f"{f['bare_cli_cpu_ms']:.0f} ms"),
        ("CPU, forked child incl. CLI - bare (agentq's own work)",
         f"{f['forked_overhead_cpu_ms']:.0f} ms"),
        ("child CPU: Python process (agentq + SDK)", f"{f['child_python_cpu_ms']:.0f} ms"),
        ("child CPU: the CLI it ran", f"{f['child_cli_cpu_ms']:.0f} ms"),
        ("child peak RSS (Python only)", f"{f['child_peak_rss_mb']:.0f} MB"),
        ("child peak RSS (with the CLI)", f"{f['child_with_cli_peak_rss_mb']:.0f} MB"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    print(f"agent execution overhead (median of {f['runs']} runs, offline model server)")
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    parser.add_argument("--bare-once", metavar="CWD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_once:
        print(json.dumps(_bare_run(dict(os.environ), Path(args.bare_once))))
        return 0
    figures = run(args.runs)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
