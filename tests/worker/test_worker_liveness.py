"""The container health check tells a hung worker from a busy one, and a worker refuses
to start with a secret still holding the stack's placeholder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import Stack
from hypothesis import given
from hypothesis import strategies as st
from support import wait_for
from worker_support import running_worker, send, state

from agentq.config import Settings
from agentq.errors import ConfigError
from agentq.local.workers import WorkerProcess, fast_env
from agentq.resources import SECRET_PLACEHOLDER
from agentq.states import TaskState
from worker.liveness import MIN_MAX_AGE_S, is_alive, max_age_s, touch
from worker.secretcheck import SECRET_VARIABLES, refuse_placeholder_secrets


def test_liveness_file_age_decides_alive(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    assert not is_alive(str(path), 60.0), "no file yet: not alive"
    touch(str(path))
    stamp = path.stat().st_mtime
    assert is_alive(str(path), 60.0, now=stamp + 59.0)
    assert not is_alive(str(path), 60.0, now=stamp + 61.0)
    touch(None)  # unset: nothing happens
    touch(str(tmp_path / "missing-dir" / "alive"))  # unwritable: never raises into the loop


@given(interval_ms=st.integers(min_value=50, max_value=10_000_000))
def test_liveness_allows_three_missed_beats_and_never_less_than_a_minute(interval_ms: int) -> None:
    # The heartbeat must also beat within the queue's visibility timeout (a checked relation).
    settings = Settings.from_env({"VISIBILITY_EXTENSION_INTERVAL": str(interval_ms),
                                  "VISIBILITY_EXTENSION_AMOUNT": str(interval_ms // 1000 + 1),
                                  "VISIBILITY_TIMEOUT": str(interval_ms // 1000 + 1)})  # fmt: skip
    assert max_age_s(settings) >= MIN_MAX_AGE_S
    assert max_age_s(settings) >= 3 * interval_ms / 1000


def test_liveness_check_command_exits_by_the_files_age(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    env = {**os.environ, "LIVENESS_FILE": str(path)}

    def check() -> int:
        return subprocess.run([sys.executable, "-m", "worker.liveness"], env=env,
                              capture_output=True, timeout=60, check=False).returncode  # fmt: skip

    assert check() == 1
    touch(str(path))
    assert check() == 0
    old = path.stat().st_mtime - 2 * MIN_MAX_AGE_S
    os.utime(path, (old, old))
    assert check() == 1


@given(value=st.text(max_size=80))
def test_secret_check_refuses_only_the_placeholder(value: str) -> None:
    for name in SECRET_VARIABLES:
        if value.strip() == SECRET_PLACEHOLDER:
            continue
        refuse_placeholder_secrets({name: value})


def test_worker_refuses_to_start_with_the_placeholder_key(stack: Stack) -> None:
    worker = WorkerProcess("placeholder")
    worker.start({**stack.env(), **fast_env(), "ANTHROPIC_API_KEY": SECRET_PLACEHOLDER})
    try:
        code = worker.wait(timeout=60)
    finally:
        worker.kill()
    assert code != 0
    output = worker.output()
    assert "ANTHROPIC_API_KEY" in output and "placeholder" in output
    assert "docs/operations.md" in output
    try:
        refuse_placeholder_secrets({"ANTHROPIC_API_KEY": f"  {SECRET_PLACEHOLDER}\n"})
    except ConfigError as exc:
        assert exc.variable == "ANTHROPIC_API_KEY"
    else:
        raise AssertionError("the placeholder was accepted")


def test_busy_worker_keeps_its_liveness_file_fresh_and_a_stopped_one_does_not(
    stack: Stack, tmp_path: Path
) -> None:
    path = tmp_path / "alive"
    with running_worker(stack, "live", LIVENESS_FILE=str(path)) as worker:
        wait_for(path.exists, timeout=60, message="the first beat")
        envelope = send(stack, "sample-sleep", {"seconds": 30})
        wait_for(lambda: (r := state(stack, envelope)) and r.state is TaskState.PROCESSING,
                 timeout=60, message="the task running")  # fmt: skip
        # Busy: every slot's child sleeps, yet the heartbeat keeps touching the file.
        first = path.stat().st_mtime
        wait_for(lambda: path.stat().st_mtime > first, timeout=30, message="a later beat")
        # Hung: a stopped process beats no more, and the file ages past any bound.
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            stopped_at = path.stat().st_mtime
            wait_for(lambda: not is_alive(str(path), 1.0), timeout=30, message="a stale file")
            assert path.stat().st_mtime == stopped_at
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        wait_for(lambda: is_alive(str(path), 1.0), timeout=30, message="beating again")
