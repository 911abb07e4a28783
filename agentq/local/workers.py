"""Start and stop real worker processes (``python -m worker``) for tests, the chaos
harness, benchmarks and the demo.

A `WorkerProcess` runs in its own session with its output in a log file, so a caller
can SIGTERM it (drain), SIGKILL it together with its task children (a crashed host),
SIGKILL one task's child and what it started (`kill_task`: the OOM killer), and read
what it logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from agentq.local.launcher import ProcessHandle, python_module

STATS_MARKER: Final = "AGENTQ_WORKER_STATS "
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
SAMPLE_DEFINITIONS: Final = REPO_ROOT / "definitions" / "testing"


def fast_env(**overrides: str) -> dict[str, str]:
    """Short intervals for tests: heartbeats every 0.3 s, leases of 3 s, quick retries."""
    env = {
        "WAIT_TIME_SECONDS": "1",
        "VISIBILITY_EXTENSION_INTERVAL": "300",
        "VISIBILITY_EXTENSION_AMOUNT": "2",
        "RETRY_BACKOFF_BASE": "0.2",
        "RETRY_BACKOFF_MAX": "1",
        "CLAUDE_KILL_GRACE": "500",
        "DRAIN_TIMEOUT": "10000",
        "TASK_DEFINITIONS_DIR": str(SAMPLE_DEFINITIONS),
        "LOG_LEVEL": "INFO",
    }
    env.update(overrides)
    return env


def poll_pause(waited_s: float, first_s: float = 0.05) -> float:
    """The pause before the next look at a condition waited on for `waited_s`: a tenth
    of the time waited (from `first_s`, at most a second), so a long wait looks less
    often; the tests' waits (tests/support.py) pause the same way."""
    return max(first_s, min(waited_s / 10, 1.0))


class WorkerProcess:
    """One ``python -m worker`` process."""

    def __init__(self, name: str = "worker", log_dir: Path | None = None) -> None:
        self.name = name
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="agentq-worker-log-"))
        self.log_path = self._log_dir / f"{name}.log"
        self.process: ProcessHandle | None = None
        self._children: set[int] = set()

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(
        self, env: Mapping[str, str], *, inherit: bool = True, fresh: bool = False
    ) -> WorkerProcess:
        """Start `python -m worker`: forked from a launcher while the test suite has
        `FORKING` on, unless `fresh` (a new interpreter, as a host starts it)."""
        full = {**os.environ, **env} if inherit else dict(env)
        full.setdefault("WORKER_ID", f"{self.name}-{os.getpid()}")
        with self.log_path.open("ab") as log:
            self.process = python_module("worker", env=full, cwd=REPO_ROOT, log=log, fresh=fresh)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send(self, sig: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Ask the worker to drain; kill it (and its task children) if it does not."""
        if self.process is None:
            return None
        if self.alive():
            self.send(sig)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def task_children(self) -> list[psutil.Process]:
        """The worker's task children and their descendants (they run in own sessions)."""
        if not self.alive():
            return []
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill(self) -> None:
        """SIGKILL the worker and every process it started, like a host that died."""
        if self.process is None:
            return
        victims = self.task_children()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        for proc in victims:
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        psutil.wait_procs(victims, timeout=5)

    def kill_task(self, request_id: str) -> list[int]:
        """SIGKILL the child running `request_id` here, with its process group (the
        Claude CLI it started); returns the pids of the children killed (none: not here)."""
        # The worker names each task dir `agentq-{request id[:40]}-…`; the child runs in it.
        marker = f"agentq-{request_id[:40]}-"
        mine: list[psutil.Process] = []
        for process in self.task_children():
            with contextlib.suppress(psutil.Error):
                if marker in process.cwd() or any(marker in a for a in process.cmdline()):
                    mine.append(process)
        pids = {p.pid for p in mine}
        leaders = [p for p in mine if p.ppid() not in pids]
        for leader in leaders:
            # Each child leads its own session and group: never the worker's.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(leader.pid) == leader.pid:
                    os.killpg(leader.pid, signal.SIGKILL)
        for process in mine:
            with contextlib.suppress(psutil.Error):
                process.kill()
        return sorted(p.pid for p in leaders)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        """The worker's JSON log lines (EMF metric lines included)."""
        records = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        return records

    def stats(self) -> dict[str, Any] | None:
        """The stats line a worker prints on exit (AWS calls per operation, verdicts)."""
        for line in reversed(self.output().splitlines()):
            if line.startswith(STATS_MARKER):
                data: dict[str, Any] = json.loads(line[len(STATS_MARKER) :])
                return data
        return None

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        start = time.monotonic()
        while (waited := time.monotonic() - start) < timeout:
            if text in self.output():
                return
            if not self.alive():
                break
            time.sleep(poll_pause(waited))  # each look reads the whole log
        raise AssertionError(f"{self.name} never logged {text!r}:\n{self.output()[-3000:]}")

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.kill()
