"""Warm spares: task children started before their task, heavy imports already done.

A fresh child pays for the interpreter and, for an agent task, ``import
claude_agent_sdk`` (about 2 s of CPU) before its task begins. A spare is the same
``python -m worker.child`` with ``--spare``, in its own session and with the same
filtered environment; it imports the python kind (and the agent kind with ``--agent``),
prints `READY_LINE` and blocks reading one line from stdin: the task dir. One spare
serves one task and exits, so tasks stay isolated per process.

Spares import the SDK only while this worker runs agent tasks (one started within
`AGENT_WARM_S`; `WARM_AGENT=always` for a worker that only runs them, `never` for one
that never does): warming it for python tasks would spend ~2 s of CPU per task on an
import nobody uses. A task takes a spare warmed for its kind
first, any spare otherwise (an agent task in a python spare imports the SDK itself).
A *bulk* task (of the lowest of several tiers) takes a spare only while more than half
the pool is ready, leaving the rest to the tiers above it: under a bulk flood the pool
ran dry, and an urgent task arriving then paid for a fresh interpreter on a busy
machine (docs/benchmarks.md).

Plain spares (the python kind only) are forked from the worker's fork server
(worker/child/forkserver.py, `fork`; ~2 ms where a fresh interpreter costs ~0.1 s of CPU), and
a python task that finds none ready has one forked for it at once. Agent spares, and
every spare once the fork server has failed, are started afresh.

The pool keeps `size` spares idle. It warms one spare at a time (a warming spare takes a
core from running tasks), replaces spares that are taken (3 s after an agent task's
hand-off, 0.2 s after a python task's; the keeper wakes for it) or die, and gives up after
`max_crashes` spares died idle within `crash_window_s` (a broken install must not spin).
If the worker dies, every idle spare reads end-of-file on stdin and exits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agentq.config import WarmAgent
from agentq.security import sanitize_error_message
from worker.child.forkclient import ForkedProcess, ForkServer
from worker.child.isolation import ChildUser, popen_options
from worker.child.proctree import ChildProcess, terminate_tree
from worker.child.runner import READY_LINE

logger = logging.getLogger(__name__)

SPARE_COMMAND: Final = (sys.executable, "-m", "worker.child", "--spare")
AGENT_FLAG: Final = "--agent"
# How long after its last agent task a worker keeps warming the SDK into its spares.
AGENT_WARM_S: Final = 600.0
KEEPER_POLL_S: Final = 0.5
REPLACE_DELAY_S: Final = 3.0
# A plain spare (the python kind only) warms in ~0.1 s of CPU, and a python task has no
# CLI to boot: its replacement waits only for the task's own hand-over.
PLAIN_REPLACE_DELAY_S: Final = 0.2
# How long a spare forked for a waiting task may take to announce itself.
FRESH_READY_S: Final = 5.0
# Importing the SDK under heavy load has been seen to take ~10 s; beyond this it is stuck.
WARM_UP_LIMIT_S: Final = 120.0


@dataclass(eq=False)
class Spare:
    process: ChildProcess
    agent: bool = False  # the agent kind (the SDK) is imported
    started: float = field(default_factory=time.monotonic)
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    def hand(self, task_dir: Path) -> bool:
        """Give the spare its task; False if it can no longer take one."""
        assert self.process.stdin is not None
        line = json.dumps({"task_dir": str(task_dir)}).encode() + b"\n"
        try:
            self.process.stdin.write(line)
            self.process.stdin.close()
        except (OSError, ValueError):
            return False
        return True


class SparePool:
    def __init__(
        self,
        *,
        env: Mapping[str, str],
        size: int,
        cwd: Path,
        grace_s: float = 5.0,
        max_crashes: int = 3,
        crash_window_s: float = 60.0,
        restart_delay_s: float = 1.0,
        replace_delay_s: float = REPLACE_DELAY_S,
        plain_replace_delay_s: float = PLAIN_REPLACE_DELAY_S,
        command: Sequence[str] = SPARE_COMMAND,
        warm_agent: WarmAgent = "recent",
        fork: bool = False,
        user: ChildUser | None = None,
    ) -> None:
        self._env = dict(env)
        self._fork = fork
        self._server: ForkServer | None = None
        self._user = user
        self._size = size
        self._cwd = cwd
        self._grace_s = grace_s
        self._max_crashes = max_crashes
        self._crash_window_s = crash_window_s
        self._restart_delay_s = restart_delay_s
        self._replace_delay_s = replace_delay_s
        self._plain_replace_delay_s = plain_replace_delay_s
        self._command = list(command)
        self._warm_agent = warm_agent
        self._agent_seen = -AGENT_WARM_S  # monotonic time of the last agent task
        self._idle: list[Spare] = []
        self._crashes: list[float] = []
        self._next_start = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.disabled = False
        self.taken = 0
        self._keeper = threading.Thread(target=self._keep, name="spares", daemon=True)

    # -- the worker's side -------------------------------------------------------------
    def start(self) -> None:
        self._keeper.start()

    def take(self, kind: str | None = None, *, bulk: bool = False) -> Spare | None:
        """A warmed, live spare for the next task, or None (the caller spawns instead).

        One warmed for `kind` first: an agent spare for an agent task, a plain one for
        a python task (an agent spare would have imported the SDK for nothing). For a
        `bulk` task, None while half the pool or fewer are ready: those are kept for
        the tiers above.
        """
        agent = kind == "agent"
        with self._lock:
            if agent:
                self._agent_seen = time.monotonic()
            ready = [s for s in self._idle if s.ready.is_set() and s.process.poll() is None]
            ready.sort(key=lambda s: s.agent != agent)  # stable: matching ones first
            if len(ready) <= (self._size // 2 if bulk else 0):
                return None
            spare = ready[0]
            self._idle.remove(spare)
            self.taken += 1
            # The replacement waits until the task's own start (the CLI booting) is
            # past, so warming (the SDK's import) does not compete with it for a core;
            # where neither is coming, a pool that waited that long would run dry at a
            # third of a task a second.
            agentic = agent or self._wants_agent()
            delay = self._replace_delay_s if agentic else self._plain_replace_delay_s
            self._next_start = max(self._next_start, time.monotonic() + delay)
        self._wake.set()  # the keeper sleeps until the replacement is due, not a poll
        return spare

    def fresh(self, kind: str | None) -> Spare | None:
        """A spare forked now for a python task that found none ready, or None (the
        caller starts a fresh child, as without a fork server)."""
        if kind == "agent" or self._wants_agent():
            return None
        with self._lock:
            if self._closed or self.disabled:
                return None
            spare = self._forked()
        if spare is None:
            return None
        assert spare.process.stdout is not None
        ready, _, _ = select.select([spare.process.stdout], [], [], FRESH_READY_S)
        line = spare.process.stdout.readline(len(READY_LINE) + 1) if ready else b""
        if line != READY_LINE:
            self.discard(spare)
            return None
        logger.info(f"warm child {spare.pid} ready (forked for a waiting task)")
        self.taken += 1
        return spare

    def discard(self, spare: Spare) -> None:
        """A taken spare that could not accept its task: end it like any child."""
        terminate_tree(spare.process, grace_s=0, known=set())
        _close_pipes(spare.process)

    def close(self) -> None:
        """Stop warming and end every idle spare; returns when none is left."""
        with self._lock:
            self._closed = True
            spares, self._idle = self._idle, []
        self._wake.set()
        if self._keeper.is_alive():
            self._keeper.join(timeout=10)
        for spare in spares:
            # End-of-file alone ends a warmed spare; the signal ends one still importing.
            with contextlib.suppress(OSError, ValueError):
                assert spare.process.stdin is not None
                spare.process.stdin.close()
            terminate_tree(spare.process, grace_s=self._grace_s, known=set())
            _close_pipes(spare.process)
        if self._server is not None:
            self._server.close()

    def kill(self) -> None:
        """SIGKILL every idle spare at once: for a worker exiting without a drain.

        Lock-free (it runs in a signal handler); one still importing would otherwise
        outlive the worker until its imports are done and it reads end-of-file.
        """
        self._closed = True
        for spare in list(self._idle):
            with contextlib.suppress(OSError):
                os.killpg(spare.pid, signal.SIGKILL)
        if self._server is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._server.process.pid, signal.SIGKILL)

    def wait_ready(self, timeout_s: float, *, count: int = 1) -> bool:
        """Whether `count` warmed spares are idle within `timeout_s` (benchmarks wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                ready = [s for s in self._idle if s.ready.is_set() and s.process.poll() is None]
                if len(ready) >= count:
                    return True
            time.sleep(KEEPER_POLL_S / 5)
        return False

    @property
    def fork_server_pid(self) -> int | None:
        server = self._server
        return None if server is None else server.process.pid

    def idle_pids(self) -> list[int]:
        with self._lock:
            return [spare.pid for spare in self._idle]

    # -- the keeper thread ---------------------------------------------------------------
    def _keep(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._reap()
                if self._should_start():
                    try:
                        self._idle.append(self._spawn())
                    except OSError:
                        logger.exception("warm child could not be started")
                        self._crashed()
                pause = KEEPER_POLL_S
                if len(self._idle) < self._size and self._next_start > time.monotonic():
                    pause = min(pause, self._next_start - time.monotonic())
            self._wake.wait(pause)
            self._wake.clear()

    def _should_start(self) -> bool:
        if self.disabled or len(self._idle) >= self._size:
            return False
        if any(not spare.ready.is_set() for spare in self._idle):
            return False  # one warming at a time
        return time.monotonic() >= self._next_start

    def _wants_agent(self) -> bool:
        if self._warm_agent == "recent":
            return time.monotonic() - self._agent_seen < AGENT_WARM_S
        return self._warm_agent == "always"

    def _forked(self) -> Spare | None:
        """A plain spare from the fork server (started on first use), or None: the
        server could not start or answer, and spares start afresh from now on."""
        if not self._fork:
            return None
        try:
            if self._server is None:
                self._server = ForkServer(env=self._env, cwd=self._cwd, user=self._user)
            return Spare(self._server.fork())
        except OSError:
            logger.exception("the fork server failed; warm children start afresh from now on")
            self._fork = False
            if self._server is not None:
                self._server.close()
            return None

    def _spawn(self) -> Spare:
        agent = self._wants_agent()
        spare = None if agent else self._forked()
        if spare is not None:
            threading.Thread(
                target=self._await_ready, args=(spare,), name=f"spare-{spare.pid}", daemon=True
            ).start()
            return spare
        process = subprocess.Popen(
            [*self._command, AGENT_FLAG] if agent else self._command,
            cwd=self._cwd,
            env=self._env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **popen_options(self._user),
        )
        spare = Spare(process, agent=agent)
        threading.Thread(
            target=self._await_ready, args=(spare,), name=f"spare-{process.pid}", daemon=True
        ).start()
        return spare

    def _await_ready(self, spare: Spare) -> None:
        assert spare.process.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            if spare.process.stdout.readline(len(READY_LINE) + 1) == READY_LINE:
                spare.ready.set()
                forked = " (forked)" if isinstance(spare.process, ForkedProcess) else ""
                logger.info(f"warm child {spare.pid} ready{forked}")
        self._wake.set()

    def _reap(self) -> None:
        """Drop idle spares that died or never got ready; each counts as a crash."""
        now = time.monotonic()
        for spare in list(self._idle):
            code = spare.process.poll()
            stuck = not spare.ready.is_set() and now - spare.started > WARM_UP_LIMIT_S
            if code is None and not stuck:
                continue
            self._idle.remove(spare)
            if code is None:
                terminate_tree(spare.process, grace_s=0, known=set())
            logger.warning(
                "warm child ended before its task",
                extra={"pid": spare.pid, "returncode": spare.process.returncode,
                       "stderr": _tail(spare.process)},
            )  # fmt: skip
            _close_pipes(spare.process)
            self._crashed()

    def _crashed(self) -> None:
        now = time.monotonic()
        self._crashes = [t for t in self._crashes if now - t < self._crash_window_s] + [now]
        self._next_start = now + self._restart_delay_s
        if len(self._crashes) >= self._max_crashes and not self.disabled:
            self.disabled = True
            logger.error(
                "warm children keep crashing; tasks start fresh children from now on",
                extra={"crashes": len(self._crashes)},
            )


def _tail(process: ChildProcess) -> str:
    """What a dead spare wrote to stderr (bounded, and never blocking)."""
    stream = process.stderr
    if stream is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        if select.select([stream], [], [], 0)[0]:
            text = os.read(stream.fileno(), 4096).decode("utf-8", "replace")
            return sanitize_error_message(text, limit=2000)
    return ""


def _close_pipes(process: ChildProcess) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.close()
