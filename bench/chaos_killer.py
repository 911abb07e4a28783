"""The chaos harness's hand: kills workers and task children, and freezes workers.

Each strike picks a random worker that is not frozen and is up (`_ready`), and either

- SIGKILLs one task child (`child_kill_share` of strikes, when it has one);
- freezes it with its children (SIGSTOP, `freeze_share` of strikes, when it runs a
  task) for longer than a lease, then resumes them (SIGCONT): a stale holder that
  wakes up believing it still holds its tasks, while another worker took them over;
- drains it (SIGTERM, `drain_share` of strikes, when it runs a task; the workers of a
  --faults run have a 200 ms DRAIN_TIMEOUT): it gives back what it holds and releases
  what it runs, and is started again (bench.chaos_drains checks the give-backs);
- or SIGKILLs it with its children, like a host that died, and starts it again.

Quotas (`min_worker_kills`, `min_freezes`) are what a run must deliver whatever its
pace: the harness keeps the killer striking until they are met (`quota_met`), and a
strike on a worker running tasks freezes it whenever freezes fall behind their share of
the quotas, since a freeze needs running tasks and those run out as the run settles;
while worker kills fall behind theirs, a roll that would freeze kills instead.

Workers get their environment from `env` plus `per_worker[name]` (a clock offset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from agentq.local.workers import WorkerProcess
from bench.chaos_drains import BAIT_PREFIX, Drain, log_size, records_between
from bench.chaos_model import Freeze, Kill
from worker.child.forkclient import FORK_SERVER_COMMAND

# The worker's fork server (worker.child.forkclient): the parent of its forked spares.
FORK_SERVER_MODULE = FORK_SERVER_COMMAND[2]


@dataclass(frozen=True, kw_only=True)
class Strikes:
    interval_s: tuple[float, float] = (2.0, 5.0)
    child_kill_share: float = 0.3
    freeze_share: float = 0.0
    freeze_s: float = 0.0  # how long a frozen worker stays stopped
    min_worker_kills: int = 0
    min_freezes: int = 0
    drain_share: float = 0.0
    # Drains are struck (first, on a worker running tasks) until they gave back this many
    # messages: a drain whose tasks all finished within its timeout gives back nothing.
    min_drain_givebacks: int = 0


class Killer:
    def __init__(
        self,
        fleet: list[WorkerProcess],
        env: Mapping[str, str],
        strikes: Strikes,
        rng: random.Random,
        per_worker: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._fleet = fleet
        self._env = env
        self._per_worker = per_worker or {}
        self._strikes = strikes
        self._rng = rng
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="killer", daemon=True)
        self._incarnations: Counter[str] = Counter()
        self._ids: dict[str, str] = {}
        # Worker name -> where its incarnation's log begins, and when it was first seen up.
        self._log_from: dict[str, int] = {}
        self._up_since: dict[str, float] = {}
        # Worker name -> (its Freeze's index in `freezes`, the stopped pids).
        self._frozen: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._frozen_lock = threading.Lock()
        self._resumers: list[threading.Timer] = []
        self.kills: list[Kill] = []
        self.freezes: list[Freeze] = []
        self.drains: list[Drain] = []
        self.drain_givebacks = 0
        # Strikes that came due with no worker up to strike (every one starting or frozen).
        self.idle_strikes = 0
        self.errors: list[str] = []
        self.began: float | None = None  # monotonic; how long the killer struck
        self.ended: float | None = None

    def start_worker(self, worker: WorkerProcess) -> None:
        self._incarnations[worker.name] += 1
        self._ids[worker.name] = f"{worker.name}.{self._incarnations[worker.name]}"
        env = {**self._env, **self._per_worker.get(worker.name, {})}
        self._log_from[worker.name] = log_size(worker.log_path)
        self._up_since.pop(worker.name, None)
        worker.start({**env, "WORKER_ID": self._ids[worker.name]})

    def _ready(self, worker: WorkerProcess, now: float) -> bool:
        """Up (its incarnation logged that it started) for at least the shortest strike
        interval. On a starved host a worker takes seconds to start: struck before it
        could take a message, it would be struck again and again while the run stalls
        (one was killed 40 times in a row, never up, while the other stayed frozen)."""
        since = self._up_since.get(worker.name)
        if since is None:
            start = self._log_from.get(worker.name, 0)
            head = records_between(worker.log_path, start, start + STARTED_WITHIN_BYTES)
            if not any(record.get("message") == STARTED_LINE for record in head):
                return False
            self._up_since[worker.name] = since = now
        return now - since >= self._strikes.interval_s[0]

    def start(self) -> None:
        self.began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for timer in self._resumers:
            timer.cancel()
            timer.join(timeout=THAW_WATCH_S + 5)  # a resume under way records its thaw
        for name in list(self._frozen):
            self._resume(name)  # nothing may stay stopped past the run
        if self.began is not None and self.ended is None:
            self.ended = time.monotonic()

    @property
    def worker_kills(self) -> int:
        return sum(1 for kill in self.kills if not kill.child_only)

    def quota_met(self) -> bool:
        strikes = self._strikes
        return (
            self.worker_kills >= strikes.min_worker_kills
            and (strikes.freeze_share <= 0 or len(self.freezes) >= strikes.min_freezes)
            and (strikes.drain_share <= 0 or self.drain_givebacks >= strikes.min_drain_givebacks)
        )

    def _freezes_behind(self) -> bool:
        """Fewer freezes so far than their share of the quotas' strikes (10 of 30: a
        third), so the freeze quota is met while there are still tasks to freeze."""
        if self._strikes.freeze_share <= 0:
            return False
        return self._lags(len(self.freezes), self._strikes.min_freezes)

    def _kills_behind(self) -> bool:
        """Fewer worker kills so far than their share of the quotas' strikes: a roll that
        would freeze kills instead, so a short run that freezes by luck still kills."""
        return self._lags(self.worker_kills, self._strikes.min_worker_kills)

    def _lags(self, done: int, quota: int) -> bool:
        """A quota not met whose strikes so far are fewer than its share of both quotas'."""
        if done >= quota:
            return False
        share = quota / (self._strikes.min_freezes + self._strikes.min_worker_kills)
        return done < share * (len(self.freezes) + self.worker_kills)

    @property
    def seconds(self) -> float:
        if self.began is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.began

    def _loop(self) -> None:
        low, high = self._strikes.interval_s
        # Fixed rate: a strike's own time (finding a victim, restarting the worker) is
        # part of the interval, not added to it.
        due = time.monotonic() + self._rng.uniform(low, high)
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = max(due, time.monotonic() - low) + self._rng.uniform(low, high)
            try:
                self._strike()
            except Exception as exc:  # the run goes on; the report shows it
                self.errors.append(f"killer: {exc!r}")

    def _strike(self) -> None:
        with self._frozen_lock:
            awake = [w for w in self._fleet if w.name not in self._frozen]
        now = time.monotonic()
        awake = [w for w in awake if self._ready(w, now)]
        if not awake:
            self.idle_strikes += 1
            return
        if self._drains_behind():
            # A drain gives back only what is running or buffered: strike a worker that
            # runs a bait task (bench.chaos_drains), or any task, while the quota lags.
            busy = [w for w in awake if running_tasks(w, BAIT_PREFIX)]
            busy = busy or [w for w in awake if running_tasks(w)]
            if busy:
                self._drain(self._rng.choice(busy))
                return
        worker = self._rng.choice(awake)
        children = spares_of(worker)
        roll = self._rng.random()
        # A process runs no more code once SIGKILL is sent: the time it was sent bounds
        # its execution, and nothing waits for the victims to be reaped (a frozen
        # worker's children stay zombies until it dies: waiting took most of a strike).
        # While a quota lags, half the child kills go to the quotas' strikes instead.
        child_share = self._strikes.child_kill_share * (1.0 if self.quota_met() else 0.5)
        if children and roll < child_share:
            child = self._rng.choice(children)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            self.kills.append(Kill(at=time.time(), worker=worker.name,
                                   worker_id=self._ids[worker.name], pids=(child.pid,),
                                   child_only=True))  # fmt: skip
            return
        drain = self._strikes.drain_share > 0 and roll > 1.0 - self._strikes.drain_share
        if drain and running_tasks(worker):
            self._drain(worker)
            return
        freeze = roll < child_share + self._strikes.freeze_share and not self._kills_behind()
        if children and (freeze or self._freezes_behind()):
            self._freeze(worker, [c.pid for c in children])
            return
        self._kill(worker)

    def _kill(self, worker: WorkerProcess) -> None:
        # Freeze the worker, then kill its children, then the worker: a host that dies
        # takes everything at once; the frozen worker cannot see its children end, just
        # as it could not then.
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGSTOP)
        victims = worker.task_children()
        for proc in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                proc.kill()
        at = time.time()
        pids = tuple(p.pid for p in victims)
        worker.send(signal.SIGKILL)
        worker.wait(timeout=30)  # our own child: reaped at once
        self.kills.append(Kill(at=at, worker=worker.name, worker_id=self._ids[worker.name],
                               pids=pids, child_only=False))  # fmt: skip
        self.start_worker(worker)

    def _drains_behind(self) -> bool:
        """Drains have given back fewer messages than their quota, and have taken no more
        than every other strike so far (the first included): kills and freezes go on."""
        strikes = self._strikes
        if strikes.drain_share <= 0 or self.drain_givebacks >= strikes.min_drain_givebacks:
            return False
        return 2 * len(self.drains) <= len(self.kills) + len(self.freezes)

    def _drain(self, worker: WorkerProcess) -> None:
        # The worker drains and exits by itself (DRAIN_TIMEOUT); a drain stuck for long
        # is killed, and shows as a give-back with no copy if it held anything.
        log_from = log_size(worker.log_path)
        at = time.time()
        worker.send(signal.SIGTERM)
        try:
            code: int | None = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = None
            self.errors.append(f"killer: {worker.name} did not drain within 30 s")
        records = records_between(worker.log_path, log_from, log_size(worker.log_path))
        drain = Drain.read(records, at=at, worker=worker.name,
                           worker_id=self._ids[worker.name], exit_code=code)  # fmt: skip
        self.drains.append(drain)
        self.drain_givebacks += len(drain.gave_back)
        self.start_worker(worker)

    def _freeze(self, worker: WorkerProcess, children: list[int]) -> None:
        # The worker first, so it cannot see its children stop; each child's whole
        # process group (the task and anything it started) with it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGSTOP)
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGSTOP)
        at = time.time()
        with self._frozen_lock:
            self._frozen[worker.name] = (len(self.freezes), tuple(children))
            self.freezes.append(Freeze(at=at, until=at + self._strikes.freeze_s,
                                       worker=worker.name, worker_id=self._ids[worker.name],
                                       pids=tuple(children)))  # fmt: skip
        timer = threading.Timer(self._strikes.freeze_s, self._resume, args=(worker.name,))
        timer.daemon = True
        self._resumers.append(timer)
        timer.start()

    def _resume(self, name: str) -> None:
        with self._frozen_lock:
            frozen = self._frozen.pop(name, None)
        if frozen is None:
            return
        index, children = frozen
        worker = next(w for w in self._fleet if w.name == name)
        watched = _processes(children)  # before they wake: a pid reused later is not theirs
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError, AssertionError):
            os.kill(worker.pid, signal.SIGCONT)
        at = time.time()
        # The record says when they really woke (a timer can fire late on a busy host).
        # Only this freeze's: the same worker may be frozen again with the same spares.
        self.freezes[index] = dataclasses.replace(self.freezes[index], until=at)
        # A child whose lease lapsed while it was stopped ends itself as it wakes, too soon
        # for its task to record the end: when it was seen gone is the only record of it.
        ended = (*((pid, at) for pid in children if pid not in watched),
                 *seen_gone(list(watched.values()), THAW_WATCH_S))  # fmt: skip
        self.freezes[index] = dataclasses.replace(self.freezes[index], ended=ended)


# What a worker logs once it takes messages (worker/receive/consumer.py), within the first
# bytes of its incarnation's log.
STARTED_LINE = "worker started"
STARTED_WITHIN_BYTES = 64 * 1024


# How long a resume watches its thawed children end (their watchdog acts at once; a busy
# host may take a while to run them). One still running then has no recorded end.
THAW_WATCH_S = 5.0


def _processes(pids: tuple[int, ...]) -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid)
    return found


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def seen_gone(procs: list[psutil.Process], within_s: float) -> list[tuple[int, float]]:
    """(pid, when) for each process seen ended (or a zombie) within `within_s`: an upper
    bound on when it ended, late by at most one 10 ms poll."""
    ended: list[tuple[int, float]] = []
    deadline = time.monotonic() + within_s
    while procs:
        for proc in [p for p in procs if _gone(p)]:
            ended.append((proc.pid, time.time()))
            procs.remove(proc)
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return ended


def spares_of(worker: WorkerProcess) -> list[psutil.Process]:
    """The processes the worker's tasks run in: the spares it started itself and those
    its fork server forked (worker.child.forkserver), not the fork server: a strike at a
    task's child must hit a task, and a freeze stop the tasks with their worker."""
    descendants = worker.task_children()
    parents = {worker.pid}
    for proc in descendants:
        with contextlib.suppress(psutil.Error):
            if proc.ppid() == worker.pid and FORK_SERVER_MODULE in proc.cmdline():
                parents.add(proc.pid)
    spares = []
    for proc in descendants:
        with contextlib.suppress(psutil.Error):
            if proc.pid not in parents and proc.ppid() in parents:
                spares.append(proc)
    return spares


def running_tasks(worker: WorkerProcess, prefix: str = "") -> list[psutil.Process]:
    """The worker's children that run a task (whose request id starts with `prefix`): a
    task child works in its own task dir (`agentq-{requestId}-…`, worker.settle.handler), an
    idle warm spare (worker.child.spares) in the worker's home (`agentq-home-…`)."""
    running = []
    for proc in spares_of(worker):
        with contextlib.suppress(psutil.Error, AssertionError):
            place = os.path.basename(proc.cwd())
            if place.startswith(f"agentq-{prefix}") and not place.startswith("agentq-home-"):
                running.append(proc)
    return running
