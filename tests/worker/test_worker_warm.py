"""Warm spares: tasks run in children started (and warmed) before their message came.

Real worker processes, real spares, real signals. A spare announces itself in the
worker's log ("warm child PID ready"); the sample tasks' side log names the pid that ran
them, so a test can tell a spare's run from a freshly spawned child's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import queue_counts, running_worker, send, state

from agentq.config import Settings
from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from worker.child.env import child_environment
from worker.child.spares import Spare, SparePool
from worker.settle.handler import _bulk_tiers

pytestmark = pytest.mark.timeout(150)

READY = re.compile(r"warm child (\d+) ready")


def _ready_pids(worker: WorkerProcess) -> list[int]:
    return [int(pid) for pid in READY.findall(worker.output())]


def _wait_ready(worker: WorkerProcess, *, count: int = 1) -> list[int]:
    return wait_for(
        lambda: len(pids := _ready_pids(worker)) >= count and pids,
        timeout=60,
        message=f"{count} warm children ready",
    )


def _side_pids(side_log: Path) -> list[int]:
    if not side_log.exists():
        return []
    return [json.loads(line)["pid"] for line in side_log.read_text().splitlines() if line]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def test_task_runs_in_a_warm_spare_and_drain_leaves_nothing(stack: Stack, tmp_path: Path) -> None:
    """The spare was alive and warmed before the message was sent; it holds no AWS
    variable; the timeout clock starts at the hand-off (the spare is older than the
    timeout when it gets the task); a replacement is warmed; SIGTERM ends them all."""
    events = EventLog(stack)
    side_log = tmp_path / "side.log"
    with running_worker(stack, MAX_CONCURRENT_CLAUDE="1", CLAUDE_TIMEOUT="4000") as worker:
        spare = _wait_ready(worker)[0]
        environ = psutil.Process(spare).environ()
        assert not [name for name in environ if name.startswith("AWS_")]
        assert environ["HOME"] != os.environ.get("HOME")
        born = psutil.Process(spare).create_time()
        wait_for(lambda: time.time() - born > 5, timeout=30, message="spare older than timeout")
        sent = time.time()
        task = send(stack, "sample-sleep", {"seconds": 0.5, "side_log": str(side_log)})
        events.wait(task.request_id, "Task Completed")
        assert _side_pids(side_log) == [spare]
        assert born < sent
        replacement = _wait_ready(worker, count=2)[1]
        assert replacement != spare
        second = send(stack, "sample-echo", {"side_log": str(side_log)})
        events.wait(second.request_id, "Task Completed")
        assert _side_pids(side_log) == [spare, replacement]
        spares = _wait_ready(worker, count=3)
        children = worker.task_children()
        assert {p.pid for p in children} >= {spares[2]}
        worker.send(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    assert wait_for(lambda: _gone(spares), timeout=10, message="spares ended")
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert queue_counts(stack) == (0, 0)


def test_warm_spare_timeout_kills_its_whole_group(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    pid_file = tmp_path / "grandchild.pid"
    env = {"MAX_CONCURRENT_CLAUDE": "1", "CLAUDE_TIMEOUT": "4000", "CLAUDE_KILL_GRACE": "500"}
    with running_worker(stack, **env) as worker:
        spare = _wait_ready(worker)[0]
        task = send(stack, "sample-grandchild", {"pid_file": str(pid_file), "seconds": 60})
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), message="grandchild pid")
        grandchild = int(pid_file.read_text())
        assert psutil.Process(grandchild).ppid() == spare  # the spare ran the task
        events.wait(task.request_id, "Task Timeout")
        assert wait_for(lambda: _gone([spare, grandchild]), timeout=10, message="group killed")
        record = state(stack, task)
        assert record is not None and record.state is TaskState.TIMEOUT
        worker.stop()
    assert _gone(_ready_pids(worker))


def test_without_warm_children_tasks_spawn_fresh(stack: Stack, tmp_path: Path) -> None:
    events = EventLog(stack)
    side_log = tmp_path / "side.log"
    with running_worker(stack, WARM_CHILDREN="false") as worker:
        task = send(stack, "sample-echo", {"side_log": str(side_log)})
        events.wait(task.request_id, "Task Completed")
        assert not [p for p in worker.task_children() if "--spare" in p.cmdline()]
        assert worker.stop() == 0
    assert "warm child" not in worker.output()
    assert len(_side_pids(side_log)) == 1


def _pool(tmp_path: Path, **options: object) -> SparePool:
    env = child_environment(os.environ, home=str(tmp_path))
    return SparePool(env=env, size=1, cwd=tmp_path, grace_s=0.5, **options)  # type: ignore[arg-type]


def test_spares_that_crash_on_start_are_given_up(tmp_path: Path) -> None:
    pool = _pool(
        tmp_path,
        restart_delay_s=0.1,
        command=[sys.executable, "-c", "import sys; sys.exit(3)"],
    )
    pool.start()
    try:
        wait_for(lambda: pool.disabled, timeout=30, message="spares disabled")
        assert pool.take() is None
        assert pool.idle_pids() == []
    finally:
        pool.close()


def test_a_spare_that_dies_idle_is_replaced_and_close_ends_it(tmp_path: Path) -> None:
    pool = _pool(tmp_path, restart_delay_s=0.1)
    pool.start()
    try:
        first = wait_for(pool.idle_pids, timeout=30, message="a spare")[0]
        os.killpg(first, signal.SIGKILL)
        second = wait_for(
            lambda: [p for p in pool.idle_pids() if p != first], timeout=60, message="replaced"
        )[0]
        assert not pool.disabled
    finally:
        pool.close()
    assert _gone([first, second])


def test_spares_import_the_sdk_only_for_a_worker_running_agent_tasks(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    pool.start()
    try:
        assert pool.wait_ready(60)
        (plain,) = pool.idle_pids()
        assert "--agent" not in psutil.Process(plain).cmdline()
        assert not _sdk_loaded(plain)
        taken = pool.take("agent")  # an agent task takes the plain one: nothing better
        assert taken is not None and taken.pid == plain
        pool.discard(taken)
        wait_for(pool.idle_pids, timeout=60, message="a replacement")
        assert pool.wait_ready(120)
        (warmed,) = pool.idle_pids()
        assert "--agent" in psutil.Process(warmed).cmdline(), "warmed for agent tasks now"
        assert _sdk_loaded(warmed)
    finally:
        pool.close()


def test_a_pool_that_never_warms_the_sdk_stays_plain_after_agent_tasks(tmp_path: Path) -> None:
    pool = _pool(tmp_path, warm_agent="never")
    pool.start()
    try:
        assert pool.wait_ready(60)
        taken = pool.take("agent")
        assert taken is not None and not taken.agent
        pool.discard(taken)
        wait_for(pool.idle_pids, timeout=60, message="a replacement")
        assert pool.wait_ready(60)
        (replacement,) = pool.idle_pids()
        assert "--agent" not in psutil.Process(replacement).cmdline()
    finally:
        pool.close()


def test_warm_agent_always_gives_a_fresh_worker_sdk_spares(stack: Stack) -> None:
    with running_worker(stack, MAX_CONCURRENT_CLAUDE="1", WARM_AGENT="always") as worker:
        (spare,) = _wait_ready(worker)
        # No agent task has run: only the setting can have asked for the SDK.
        assert "--agent" in psutil.Process(spare).cmdline()
        assert _sdk_loaded(spare)
        assert worker.stop() == 0
    assert _gone([spare])


def _sdk_loaded(pid: int) -> bool:
    """Whether the process has imported the SDK: its dependencies (cryptography, through
    mcp) map a C extension, which pure-Python imports would not show in /proc maps.
    (Not pydantic's: agentq's own settings and definitions are pydantic models.)"""
    return any(
        "cryptography" in m.path and "_rust" in m.path for m in psutil.Process(pid).memory_maps()
    )


def test_a_python_task_s_spare_is_replaced_without_the_agent_delay(tmp_path: Path) -> None:
    """The agent delay (here ten minutes) keeps warming off an agent task's CLI boot; a
    pool serving python tasks replaces its spare as soon as the task is handed over."""
    pool = _pool(tmp_path, replace_delay_s=600.0, warm_agent="never")
    pool.start()
    try:
        assert pool.wait_ready(60)
        taken = pool.take("python")
        assert taken is not None
        pool.discard(taken)
        assert pool.wait_ready(60), "replaced without waiting for the agent delay"
        assert taken.pid not in pool.idle_pids()
    finally:
        pool.close()


def test_a_bulk_task_leaves_half_the_pool_to_the_tiers_above(tmp_path: Path) -> None:
    """Under a flood of lowest-tier work the pool ran dry, and an urgent task then paid
    for a fresh interpreter: a bulk task takes a spare only while more than half the
    pool is ready. (The replacement delays are ten minutes: nothing refills here.)"""
    env = child_environment(os.environ, home=str(tmp_path))
    pool = SparePool(env=env, size=4, cwd=tmp_path, grace_s=0.5, replace_delay_s=600.0,
                     plain_replace_delay_s=600.0, warm_agent="never")  # fmt: skip
    pool.start()
    taken: list[Spare] = []
    try:
        assert pool.wait_ready(90, count=4)
        for _ in range(2):
            spare = pool.take("python", bulk=True)
            assert spare is not None
            taken.append(spare)
        assert pool.take("python", bulk=True) is None
        assert pool.take("agent", bulk=True) is None
        for kind in ("python", "agent"):
            spare = pool.take(kind)
            assert spare is not None, f"the kept spares go to a {kind} task of a higher tier"
            taken.append(spare)
        assert pool.take("python") is None
        assert not set(pool.idle_pids()) & {spare.pid for spare in taken}
    finally:
        for spare in taken:
            pool.discard(spare)
        pool.close()


@pytest.mark.parametrize(
    ("queue_urls", "bulk"),
    [
        (None, set()),
        ("high=https://q/high,normal=https://q/normal,low=https://q/low", {"low"}),
        ("high=https://q/high", {"normal", "low"}),  # both on SQS_QUEUE_URL
        ("high=https://q/normal,low=https://q/normal", set()),  # one queue for all
    ],
)
def test_bulk_tiers_are_those_on_the_lowest_of_several_queues(
    queue_urls: str, bulk: set[str]
) -> None:
    settings = Settings(queue_url="https://q/normal", queue_urls=queue_urls)
    assert _bulk_tiers(settings) == bulk
