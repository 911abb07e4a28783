"""`agentq local up`: the stack stays up for other shells, and Ctrl-C stops all of it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from support import wait_for

REPO = Path(__file__).resolve().parents[2]


def _read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("AGENTQ_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_local_up_serves_another_shell_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    env_file = tmp_path / "local.env"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    env["AGENTQ_TEST_MARKER"] = marker
    up = subprocess.Popen(
        [sys.executable, "-m", "agentq.cli", "local", "up", "--workers", "1",
         "--definitions", str(REPO / "definitions" / "testing"),
         "--env-file", str(env_file), "--json"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(env_file.exists, timeout=120, message="the env file")
        stack_env = _read_env_file(env_file)
        assert stack_env["AGENTQ_LOCAL"] == "1"
        assert stack_env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")

        # Another shell: only the env file, the CLI and raw boto3.
        shell = {**os.environ, **stack_env}
        submitted = subprocess.run(
            [sys.executable, "-m", "agentq.cli", "submit", "sample-echo",
             "--input", '{"hello": "local"}', "--wait", "--timeout", "90", "--json"],
            env=shell, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        task = json.loads(submitted.stdout)
        assert task["state"] == "COMPLETED"
        assert len(_marked(marker)) >= 2  # the stack and its worker
    finally:
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=120)
    assert up.returncode == 0, err[-3000:]
    summary = json.loads(out[: out.index("\nstopping")])
    assert summary["env_file"] == str(env_file)
    assert summary["console"].startswith("http://127.0.0.1:") and "token=" in summary["console"]
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")
