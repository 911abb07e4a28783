"""The worker launcher (agentq.local.launcher): a forked process is what `python -m`
with that environment and directory would start, and its end is reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Stack
from support import wait_for

from agentq.forking import ForkedProcess
from agentq.local.launcher import FORKING, Launcher
from agentq.local.workers import WorkerProcess

pytestmark = pytest.mark.process

PROBE = """
import json, os, sys
print(json.dumps({
    "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
    "cwd": os.getcwd(), "path": sys.path[:2], "argv0": sys.argv[0], "args": sys.argv[1:],
    "own_session": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(),
    "bytecode": not sys.dont_write_bytecode, "boto3_preloaded": "boto3" in sys.modules,
    "agentq_fresh": "agentq.config" not in sys.modules,
}), flush=True)
print("to stderr", file=sys.stderr)
if os.environ.get("PROBE_WAIT"):
    open(os.environ["PROBE_WAIT"], "w").close()
    import time
    while True:
        time.sleep(0.05)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    launcher = Launcher()
    yield launcher
    launcher.close()


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "launcher_probe.py").write_text(PROBE)
    return modules


def _launch(
    launcher: Launcher, probe_dir: Path, tmp_path: Path, *args: str, **env: str
) -> tuple[ForkedProcess, Path]:
    out = tmp_path / "out.log"
    with out.open("ab") as log:
        process = launcher.launch(
            "launcher_probe",
            args,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(probe_dir), **env},
            cwd=tmp_path, stdout=log.fileno(), stderr=log.fileno(),
        )  # fmt: skip
    return process, out


def test_a_launched_module_runs_in_its_own_environment_directory_and_session(
    launcher: Launcher, probe_dir: Path, tmp_path: Path
) -> None:
    process, out = _launch(launcher, probe_dir, tmp_path, "--flag", "a b", PROBE_A="1",
                           PROBE_EXIT="3", PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    assert process.wait(timeout=30) == 3
    first, second = out.read_text().splitlines()[:2]
    seen = json.loads(first)
    # Only what was asked for: nothing of this process's or the launcher's environment.
    assert seen["env"] == {"PROBE_A": "1", "PROBE_EXIT": "3"}
    assert seen["cwd"] == str(tmp_path)
    assert seen["path"] == [str(tmp_path), str(probe_dir)]
    assert seen["argv0"].endswith("launcher_probe.py") and seen["args"] == ["--flag", "a b"]
    assert seen["own_session"] and seen["stdin"] == "" and not seen["bytecode"]
    # Libraries come preloaded; agentq's own modules are imported afresh in the fork.
    assert seen["boto3_preloaded"] and seen["agentq_fresh"]
    assert second == "to stderr"


def test_a_signal_ends_a_launched_process_as_popen_reports_it(
    launcher: Launcher, probe_dir: Path, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    process, _ = _launch(launcher, probe_dir, tmp_path, PROBE_WAIT=str(ready))
    wait_for(ready.exists, message="the probe running")
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    assert process.poll() is None
    before = launcher.reaped_cpu_s
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    # Its CPU (its imports and its loop) is reported with its end, for the suite's
    # accounting: nobody but the launcher reaps it.
    assert launcher.reaped_cpu_s > before


def test_a_request_without_its_descriptors_is_refused_and_the_launcher_serves_on(
    launcher: Launcher, probe_dir: Path, tmp_path: Path
) -> None:
    import socket

    with launcher._asking:
        launcher._sock.send(b'{"module": "x"}')
        assert launcher._answer(30).startswith("error ")
    process, _ = _launch(launcher, probe_dir, tmp_path)
    assert process.wait(timeout=30) == 0
    launcher._sock.shutdown(socket.SHUT_RDWR)  # the caller went away: the launcher ends
    assert launcher.process.wait(timeout=30) == 0


def test_a_worker_started_through_the_launcher_drains_on_sigterm(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.local.workers import fast_env

    monkeypatch.setattr(FORKING, "enabled", True)  # whatever the run's setting
    worker = WorkerProcess("launched", log_dir=tmp_path)
    worker.start({**stack.env(), **fast_env()})
    try:
        worker.wait_for_output("worker started")
        assert isinstance(worker.process, ForkedProcess)
        worker.send(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        assert any(r.get("message") == "worker stopped" for r in worker.log_records())
    finally:
        worker.kill()
