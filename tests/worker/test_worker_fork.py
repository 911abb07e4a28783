"""Forked spares: plain warm children forked from one warmed process per worker.

Real worker processes, a real fork server, real signals. The fork server is the forked
spares' parent, so their exit statuses reach the worker through it; these tests show
they do, that a spare it forks is as isolated as one started afresh, and that the
worker starts spares afresh once the server is gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import running_worker, send

from agentq.local.workers import WorkerProcess
from bench.chaos_killer import spares_of
from worker.child.env import child_environment
from worker.child.forkclient import LOST_RETURNCODE, ForkedProcess
from worker.child.spares import Spare, SparePool

pytestmark = pytest.mark.timeout(150)


def _pool(tmp_path: Path, **options: object) -> SparePool:
    env = child_environment(os.environ, home=str(tmp_path))
    return SparePool(env=env, cwd=tmp_path, grace_s=0.5, warm_agent="never", fork=True,
                     **{"size": 1, **options})  # type: ignore[arg-type]  # fmt: skip


def _idle_spare(pool: SparePool) -> Spare:
    assert pool.wait_ready(60)
    spare = pool.take("python")
    assert spare is not None
    return spare


def _server_pid(pool: SparePool) -> int:
    return wait_for(lambda: pool.fork_server_pid, timeout=30, message="fork server started")


def test_a_forked_spare_is_isolated_like_a_fresh_one_and_reports_its_exit(tmp_path: Path) -> None:
    """Its parent is the fork server, not the worker; it leads its own session, holds
    the children's filtered environment and only its three pipes; its exit code (here
    the hand-off's refusal, 2) comes back through the server."""
    pool = _pool(tmp_path)
    pool.start()
    try:
        spare = _idle_spare(pool)
        assert isinstance(spare.process, ForkedProcess)
        child = psutil.Process(spare.pid)
        assert child.ppid() == _server_pid(pool) != os.getpid()
        assert os.getsid(spare.pid) == spare.pid
        assert not [name for name in child.environ() if name.startswith("AWS_")]
        assert child.environ()["HOME"] == str(tmp_path)
        # Its three pipes and nothing else: no socket, file or descriptor of the server.
        assert {int(fd) for fd in os.listdir(f"/proc/{spare.pid}/fd")} == {0, 1, 2}
        assert spare.hand(tmp_path / "no-such-dir")
        assert spare.process.wait(timeout=10) == 2
        assert spare.process.stderr is not None
        assert b"bad task hand-off" in spare.process.stderr.read()
    finally:
        pool.close()


def test_a_killed_forked_spare_reads_as_killed(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    pool.start()
    try:
        spare = _idle_spare(pool)
        with pytest.raises(Exception, match="timed out"):
            spare.process.wait(timeout=0.2)  # alive: no status yet
        assert spare.process.poll() is None
        os.kill(spare.pid, signal.SIGKILL)
        assert spare.process.wait(timeout=10) == -signal.SIGKILL
    finally:
        pool.close()


def test_a_python_task_that_finds_no_spare_has_one_forked_at_once(tmp_path: Path) -> None:
    """The replacement delays are ten minutes: the second spare can only be forked on
    demand. An agent task gets none (the SDK is not imported in the fork server)."""
    pool = _pool(tmp_path, replace_delay_s=600.0, plain_replace_delay_s=600.0)
    pool.start()
    taken: list[Spare] = []
    try:
        taken.append(_idle_spare(pool))
        assert pool.take("python") is None
        assert pool.fresh("agent") is None
        forked = pool.fresh("python")
        assert forked is not None, "forked on demand"
        taken.append(forked)
        assert isinstance(forked.process, ForkedProcess)
        assert psutil.Process(forked.pid).ppid() == _server_pid(pool)
    finally:
        for spare in taken:
            pool.discard(spare)
        pool.close()


def test_without_the_fork_server_spares_start_afresh(tmp_path: Path) -> None:
    """The server killed: spares it forked read as killed once gone, and the pool starts
    the next ones as fresh interpreters."""
    pool = _pool(tmp_path, replace_delay_s=0.0, plain_replace_delay_s=0.0)
    pool.start()
    try:
        spare = _idle_spare(pool)
        server = _server_pid(pool)
        os.kill(server, signal.SIGKILL)
        pool.discard(spare)  # SIGKILLs the orphan
        assert spare.process.wait(timeout=10) == LOST_RETURNCODE
        assert pool.wait_ready(60)
        fresh = pool.take("python")
        assert fresh is not None
        assert not isinstance(fresh.process, ForkedProcess)
        assert "--spare" in psutil.Process(fresh.pid).cmdline()
        pool.discard(fresh)
    finally:
        pool.close()


def _ready_pids(worker: WorkerProcess) -> list[int]:
    return [int(pid) for pid in re.findall(r"warm child (\d+) ready \(forked", worker.output())]


def test_a_worker_runs_python_tasks_in_forked_spares_and_drains_clean(
    stack: Stack, tmp_path: Path
) -> None:
    events = EventLog(stack)
    side_log = tmp_path / "side.log"
    with running_worker(stack, MAX_CONCURRENT_CLAUDE="2") as worker:
        wait_for(lambda: len(_ready_pids(worker)) >= 2, timeout=60, message="spares ready")
        # Its forked spares have its command line too: the server is the worker's child.
        servers = [p for p in psutil.Process(worker.pid).children()
                   if "worker.child.forkserver" in " ".join(p.cmdline())]  # fmt: skip
        assert len(servers) == 1
        spares = _ready_pids(worker)[:2]
        assert all(psutil.Process(pid).ppid() == servers[0].pid for pid in spares)
        # What the chaos harness strikes as a task's process: the spares, not the server.
        struck = {p.pid for p in spares_of(worker)}
        assert set(spares) <= struck and servers[0].pid not in struck
        tasks = [send(stack, "sample-echo", {"side_log": str(side_log)}) for _ in range(3)]
        for task in tasks:
            events.wait(task.request_id, "Task Completed")
        ran = [json.loads(line)["pid"] for line in side_log.read_text().splitlines() if line]
        assert set(ran) <= set(_ready_pids(worker)), "every task ran in a forked spare"
        worker.send(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    assert wait_for(lambda: _ended(servers[0]), timeout=10, message="the fork server ended")


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
