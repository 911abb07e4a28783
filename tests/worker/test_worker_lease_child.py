"""The lease file between worker and child: the child's watchdog and the worker's fence.

Real children (``python -m worker.child`` in their own session, as the worker starts
them); the lease times are written the way the worker writes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from agentq.config import Settings
from agentq.definitions import TaskDefinition
from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer
from worker.child.leasefile import (
    LEASE_FILE,
    LeaseTimes,
    lease_times,
    margins,
    read_lease,
    write_lease,
)
from worker.child.supervisor import ChildExit, StopSignal, run_child
from worker.settle.outcome import decide

pytestmark = pytest.mark.timeout(90)


def _task_dir(tmp_path: Path, callable_: str, payload: dict[str, Any]) -> Path:
    definition = TaskDefinition(name="t", kind="python", settings={"callable": callable_})
    task = {"requestId": "r-1", "tenant": "acme", "attempt": 1, "jobId": None,
            "definition": definition.to_dict(), "input": payload}  # fmt: skip
    (tmp_path / "task.json").write_text(json.dumps(task))
    return tmp_path


def _times_from_now(term_in_s: float, window_s: float = 1.0) -> LeaseTimes:
    now = int(time.time() * 1000)
    term = now + int(term_in_s * 1000)
    kill = term + int(window_s * 1000)
    return LeaseTimes(effective_until_ms=kill + 500, fence_at_ms=term - 500, term_at_ms=term,
                      kill_at_ms=kill)  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_worker_lease_margins_fit_inside_the_lease() -> None:
    for interval, amount, grace in [(20_000, 30, 5_000), (300, 2, 500), (500, 2, 500),
                                    (900, 1, 5_000), (50, 1, 0)]:  # fmt: skip
        settings = Settings(extension_interval_ms=interval, extension_amount_s=amount,
                            kill_grace_ms=grace)  # fmt: skip
        m = margins(settings)
        lowest_normal = settings.lease_seconds - interval / 1000  # just before a renewal
        assert 0 < m.kill_s <= m.term_s <= m.fence_s < lowest_normal, (settings, m)
        times = lease_times(100_000, settings)
        assert times.fence_at_ms <= times.term_at_ms <= times.kill_at_ms < 100_000
    defaults = margins(Settings())
    # The SIGKILL lands the 2 s clock-skew budget before the 1 s it takes to land.
    assert (defaults.fence_s, defaults.term_s, defaults.kill_s) == (12.5, 8.0, 3.0)


def test_worker_lease_child_watchdog_ends_the_group_before_the_lease_lapses(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # Child and grandchild both ignore SIGTERM: only the watchdog's SIGKILL ends them.
    task_dir = _task_dir(tmp_path, "agentq.samples:grandchild",
                         {"pid_file": str(pid_file), "seconds": 60})  # fmt: skip
    child = subprocess.Popen([sys.executable, "-m", "worker.child", str(task_dir)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                                  timeout=30, message="the grandchild started"))  # fmt: skip
        # The lease file appears only now, as at a worker's first renewal.
        times = _times_from_now(term_in_s=0.5)
        write_lease(task_dir, times)
        code = child.wait(timeout=30)
        ended_ms = time.time() * 1000
    finally:
        child.kill()
        child.wait()
    assert code == -9
    assert ended_ms < times.kill_at_ms + 500  # SIGKILLed at kill_at, well before the lapse
    assert not _alive(grandchild)
    assert b"lease not renewed in time" in (child.stderr.read() if child.stderr else b"")
    record = json.loads((task_dir / "error.json").read_text())
    assert record["exception_type"] == "LeaseExpired" and record["retryable"] is True
    # The worker, if it ever looks again, retries the attempt rather than failing the task.
    outcome = decide(ChildExit(returncode=code, duration_ms=1, stopped=None), task_dir,
                     attempt=1, max_attempts=3)  # fmt: skip
    assert outcome.verdict == "retry" and outcome.error is not None
    assert outcome.error.exception_type == "LeaseExpired"


@pytest.mark.parametrize("content", [None, "{not json", '{"effectiveUntil": 1}'])
def test_worker_lease_child_without_a_readable_lease_is_never_stopped(
    tmp_path: Path, content: str | None
) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:sleep", {"seconds": 1.0})
    if content is not None:
        (task_dir / LEASE_FILE).write_text(content)  # an older worker's file, or garbage
    assert read_lease(task_dir) is None
    result = subprocess.run([sys.executable, "-m", "worker.child", str(task_dir)],
                            check=False, capture_output=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (task_dir / "error.json").exists()


def test_worker_lease_supervisor_mirrors_the_lease_and_fences_an_unrenewed_child(
    tmp_path: Path,
) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:sleep", {"seconds": 30})
    stop = StopSignal()
    stop.hold(_times_from_now(term_in_s=4.0))
    stop.hold(_times_from_now(term_in_s=1.0))  # an older lease never replaces a newer one
    held = stop.lease
    assert held is not None
    began = time.time() * 1000
    child = run_child(
        task_dir,
        env={**os.environ},
        timeout_s=60,
        grace_s=0.5,
        stop=stop,
        log_line=lambda stream, line: None,
    )
    mirrored = read_lease(task_dir)
    assert child.stopped == "lease_lost"
    assert held.fence_at_ms <= began + child.duration_ms < held.term_at_ms
    assert mirrored == held  # the child's watchdog read the same times
    # Stopped before it finished: a retry if the lease turns out to be still ours (the
    # handler renews it by token first and leaves the task alone if that is refused).
    fenced = decide(child, task_dir, attempt=1, max_attempts=3)
    assert fenced.fenced and fenced.verdict == "retry"


def test_worker_lease_supervisor_starts_no_child_on_a_lease_about_to_lapse(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran.jsonl"
    task_dir = _task_dir(tmp_path, "agentq.samples:noop", {"side_log": str(marker)})
    stop = StopSignal()
    stop.hold(_times_from_now(term_in_s=0.2))  # fence_at already passed: a late slot
    child = run_child(task_dir, env={**os.environ}, timeout_s=60, grace_s=0.5, stop=stop,
                      log_line=lambda stream, line: None)  # fmt: skip
    assert (child.started, child.stopped) == (False, "lease_lost")
    assert not marker.exists()
    # Nothing ran, so it costs no attempt of the budget, not even the last one.
    never_ran = decide(child, task_dir, attempt=1, max_attempts=1)
    assert never_ran.fenced and never_ran.verdict == "released"


def test_worker_lease_watchdog_ends_a_real_claude_cli_and_records_lease_expired(
    tmp_path: Path,
) -> None:
    definition = {"name": "t", "kind": "agent", "timeout_s": 150,
                  "settings": {"prompt": "Say hello.\n\n{text}", "max_turns": 2,
                               "output_schema": {"type": "object"}}}  # fmt: skip
    task = {"requestId": "r-agent", "tenant": "acme", "attempt": 1, "jobId": None,
            "definition": definition, "input": {"text": "Hi [[model: key held; stall]]"}}  # fmt: skip
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "task.json").write_text(json.dumps(task))
    home = tmp_path / "home"
    with ModelServer() as model:
        env = {**os.environ, **offline_claude_env(model.url, home), "HOME": str(home)}
        child = subprocess.Popen([sys.executable, "-m", "worker.child", str(task_dir)],
                                 cwd=task_dir, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)  # fmt: skip
        try:
            # The CLI has asked the model and waits for an answer that never comes.
            wait_for(lambda: model.request_log, timeout=90, message="the CLI's first request")
            members = [p for p in _group(child.pid) if p != child.pid]
            assert members, "the Claude CLI runs in the child's process group"
            times = _times_from_now(term_in_s=0.2, window_s=2.0)
            write_lease(task_dir, times)
            code = child.wait(timeout=30)
            ended_ms = time.time() * 1000
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert ended_ms < times.kill_at_ms + 500
    assert not any(_alive(pid) for pid in members)  # the CLI did not outlive the attempt
    record = json.loads((task_dir / "error.json").read_text())
    assert (record["exception_type"], record["retryable"]) == ("LeaseExpired", True), code


def _group(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with (
                contextlib.suppress(OSError, IndexError, ValueError),
                open(f"/proc/{name}/stat") as stat,
            ):
                if int(stat.read().rsplit(")", 1)[1].split()[2]) == pgid:
                    found.append(int(name))
    return found
