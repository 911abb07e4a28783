"""The chaos harness: is every task settled exactly once while workers keep dying?

K worker processes share one local stack (moto's server, the local Lambda host for
save-event and the DLQ processor). N tasks mix success, fail-once-then-succeed,
permanent failure, timeout, malformed messages and duplicate sends. A killer SIGKILLs a
random worker (with its children, like a host that died) or sometimes just one task
child every few seconds, and restarts the worker. Leases and the queue's visibility are
short, so takeovers happen within the run.

Afterwards `verify` checks, from the STATE items, the event timelines, the queues, the
DLQ archive and the tasks' own side log (bench.tasks):

- every task has exactly one terminal state, exactly one terminal event that agrees
  with it, and the expected state (a task disrupted by a kill may instead have FAILED:
  its attempts or receives were used up by the kills);
- no two executions of one task overlapped in time (an execution killed without an
  end record is bounded by the kill that ended it);
- no execution started after the execution that completed the task;
- every dead-lettered task that was closed out has its `Task Failed`;
- nothing is left in the task queue, the DLQ or in flight;
- no process of the run (marked by AGENTQ_CHAOS_RUN in its environment) survived.

    python -m bench.chaos --tasks 500 --workers 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.local.aws import MotoServer
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import WorkerProcess
from agentq.states import TaskState
from agentq.store import keys
from bench.chaos_verify import (
    MARKER,
    ChaosReport,
    Kill,
    Kind,
    Malformed,
    Planned,
    verify,
)
from bench.stack import (
    Stage,
    envelope,
    moto_server,
    new_stage,
    read_side_log,
    stop_all,
    worker_env,
)


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    tasks: int = 500
    workers: int = 4
    slots: int = 3
    kill_interval_s: tuple[float, float] = (2.0, 5.0)
    child_kill_share: float = 0.3
    # Stop killing once this share of tasks is terminal, so the run can settle.
    kill_until_done: float = 0.9
    visibility_timeout_s: int = 5
    heartbeat_interval_ms: int = 500
    # Leases last 1.5x this (6 s). With 3 s, renewals against a busy moto server came
    # back late so often that workers fenced healthy attempts ~770 times in a 500-task
    # run, and most tasks ended dead-lettered by the retries (safe, but not a test).
    extension_s: int = 4
    timeout_s: float = 900.0
    # With the queue empty and no task finishing for this long, the rest are stuck.
    stall_s: float = 20.0
    seed: int | None = None


# -- the plan ----------------------------------------------------------------------------
def plan(config: ChaosConfig, rng: random.Random, side_log: Path) -> list[Planned]:
    kinds: list[Kind] = rng.choices(
        ["ok", "flaky", "permanent", "timeout", "duplicate"],
        weights=[55, 15, 10, 5, 15],
        k=config.tasks,
    )
    planned = []
    for kind in kinds:
        payload: dict[str, Any] = {"side_log": str(side_log), "seconds": rng.uniform(0.1, 1.0)}
        definition = "bench-work"
        if kind == "flaky":
            payload["mode"] = "flaky"
        elif kind == "permanent":
            payload["mode"] = "permanent"
        elif kind == "timeout":
            definition, payload["seconds"] = "bench-hang", 30
        planned.append(Planned(envelope=envelope(definition, payload), kind=kind))
    return planned


def malformed_messages(count: int) -> list[Malformed]:
    shapes = []
    for n in range(count):
        rid = f"chaos-bad-{uuid.uuid4().hex[:10]}"
        shape = n % 3
        if shape == 0:
            shapes.append(Malformed(body="{not json", attributes={"requestId": rid},
                                    request_id=rid, tenant=Settings().tenant_id))  # fmt: skip
        elif shape == 1:
            body = envelope("bench-work", {}).to_body()
            shapes.append(Malformed(body=body, attributes={"requestId": "bad id !"},
                                    request_id=None, tenant=""))  # fmt: skip
        else:
            bad = TaskEnvelope(request_id=rid, tenant="bench", definition="no-such-definition")
            shapes.append(Malformed(body=bad.to_body(), attributes={"requestId": rid},
                                    request_id=rid, tenant="bench"))  # fmt: skip
    return shapes


# -- the killer --------------------------------------------------------------------------
class Killer:
    """Kills a random worker (with its children) or one task child, then restarts it."""

    def __init__(
        self,
        fleet: list[WorkerProcess],
        env: Mapping[str, str],
        config: ChaosConfig,
        rng: random.Random,
    ) -> None:
        self._fleet = fleet
        self._env = env
        self._config = config
        self._rng = rng
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="killer", daemon=True)
        self._incarnations: Counter[str] = Counter()
        self._ids: dict[str, str] = {}
        self.kills: list[Kill] = []
        self.errors: list[str] = []
        self.began: float | None = None  # monotonic; how long the killer struck
        self.ended: float | None = None

    def start_worker(self, worker: WorkerProcess) -> None:
        self._incarnations[worker.name] += 1
        self._ids[worker.name] = f"{worker.name}.{self._incarnations[worker.name]}"
        worker.start({**self._env, "WORKER_ID": self._ids[worker.name]})

    def start(self) -> None:
        self.began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        if self.began is not None and self.ended is None:
            self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        if self.began is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.began

    def _loop(self) -> None:
        low, high = self._config.kill_interval_s
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
        worker = self._rng.choice(self._fleet)
        children = []
        for proc in worker.task_children():
            with contextlib.suppress(psutil.Error):
                if proc.ppid() == worker.pid:
                    children.append(proc)
        # A process runs no more code once SIGKILL is sent: the time it was sent bounds
        # its execution, and nothing waits for the victims to be reaped (a frozen
        # worker's children stay zombies until it dies: waiting took most of a strike).
        if children and self._rng.random() < self._config.child_kill_share:
            child = self._rng.choice(children)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            self.kills.append(Kill(at=time.time(), worker=worker.name,
                                   worker_id=self._ids[worker.name], pids=(child.pid,),
                                   child_only=True))  # fmt: skip
            return
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
        self.kills.append(
            Kill(
                at=at,
                worker=worker.name,
                worker_id=self._ids[worker.name],
                pids=pids,
                child_only=False,
            )
        )
        self.start_worker(worker)


# -- running -----------------------------------------------------------------------------
def run(
    config: ChaosConfig, *, server: MotoServer | None = None, work_dir: Path | None = None
) -> ChaosReport:
    if server is None:
        with moto_server() as own:
            return run(config, server=own, work_dir=work_dir)
    rng = random.Random(config.seed)
    work_dir = work_dir or Path(tempfile.mkdtemp(prefix="agentq-chaos-"))
    side_log = work_dir / "executions.jsonl"
    stage = new_stage(server, prefix="c")
    stage.set_visibility_timeout(config.visibility_timeout_s)
    run_id = uuid.uuid4().hex[:12]
    env = worker_env(
        stage,
        MAX_CONCURRENT_CLAUDE=str(config.slots),
        VISIBILITY_EXTENSION_INTERVAL=str(config.heartbeat_interval_ms),
        VISIBILITY_EXTENSION_AMOUNT=str(config.extension_s),
        **{MARKER: run_id},
    )
    planned = plan(config, rng, side_log)
    bad = malformed_messages(max(1, config.tasks // 20))
    report = ChaosReport(tasks=len(planned), malformed=len(bad))
    saved_env = dict(os.environ)
    os.environ.update(stage.env())  # the Lambda handlers read it, as on Lambda
    # The handlers log and print EMF metrics to stdout; keep them out of the report. The
    # file stays open: Powertools keeps the stream it saw at import.
    lambda_log = (work_dir / "lambda-host.log").open("a")
    redirect = contextlib.redirect_stdout(lambda_log)
    redirect.__enter__()
    began = time.monotonic()
    fleet = [WorkerProcess(f"w{i}", log_dir=work_dir) for i in range(config.workers)]
    killer = Killer(fleet, env, config, rng)
    host = LambdaHost(stage.resources, Settings.from_env(), health_interval_s=0)
    try:
        host.start()
        for worker in fleet:
            killer.start_worker(worker)
        duplicates = [p for p in planned if p.kind == "duplicate"]
        stage.send([p.envelope for p in planned])
        for message in bad:
            stage.send_raw(message.body, message.attributes)
        killer.start()
        _settle(stage, planned, duplicates, killer, config, began)
        killer.stop()
        with contextlib.suppress(TimeoutError):
            stage.wait_drained(30)  # verify reports what is left
        stop_all(fleet)
        try:
            _wait_lambda_host(stage, host)
        except TimeoutError as exc:
            report.violations.append(str(exc))
    finally:
        killer.stop()
        for worker in fleet:
            if worker.alive():
                worker.kill()
        with contextlib.suppress(Exception):
            host.stop()
        os.environ.clear()
        os.environ.update(saved_env)
        redirect.__exit__(None, None, None)
    report.seconds = time.monotonic() - began
    report.killing_seconds = killer.seconds
    (work_dir / "kills.json").write_text(json.dumps([k.__dict__ for k in killer.kills], indent=1))
    report.duplicates_sent = len([p for p in planned if p.kind == "duplicate"])
    report.violations.extend(killer.errors)
    verify(stage, planned, bad, read_side_log(side_log), killer.kills, fleet, run_id, report)
    return report


def _settle(
    stage: Stage,
    planned: Sequence[Planned],
    duplicates: Sequence[Planned],
    killer: Killer,
    config: ChaosConfig,
    began: float,
) -> None:
    """Wait until every task is terminal; re-send duplicates once half are done."""
    open_tasks = {p.envelope.request_id: p for p in planned}
    resent = False
    killing = True
    deadline = began + config.timeout_s
    progress_at = time.monotonic()
    while open_tasks:
        now = time.monotonic()
        if now > deadline:
            return  # verify reports every task that is not terminal
        if not killing and now - progress_at > config.stall_s and stage.queue_counts() == (0, 0):
            return  # nothing left to deliver: the open tasks are stuck (verify reports them)
        for request_id in _terminal(stage, list(open_tasks.values())):
            del open_tasks[request_id]
            progress_at = time.monotonic()
        done = 1 - len(open_tasks) / max(1, len(planned))
        if not resent and done >= 0.5:
            # Copies of tasks that are finished, running or still queued.
            stage.send([p.envelope for p in duplicates])
            resent = True
        if killing and done >= config.kill_until_done:
            killer.stop()
            killing = False
        time.sleep(1.0)
    if not resent:
        stage.send([p.envelope for p in duplicates])


def _terminal(stage: Stage, items: Sequence[Planned]) -> list[str]:
    """Request ids whose STATE item is terminal: 100 per BatchGetItem, strongly consistent.

    moto's server runs one DynamoDB request at a time; polling item by item would
    starve the workers and the Lambda host and slow the very run it watches.
    """
    ddb, table = stage.clients["dynamodb"], stage.resources.table_name
    done = []
    for start in range(0, len(items), 100):
        keys_ = [{"PK": {"S": keys.task_pk(p.envelope.tenant, p.envelope.request_id)},
                  "SK": {"S": keys.STATE_SK}} for p in items[start : start + 100]]  # fmt: skip
        request = {table: {"Keys": keys_, "ConsistentRead": True,
                           "ProjectionExpression": "requestId, #s",
                           "ExpressionAttributeNames": {"#s": "state"}}}  # fmt: skip
        while request:
            response = ddb.batch_get_item(RequestItems=request)
            for item in response["Responses"].get(table, []):
                if TaskState(item["state"]["S"]).terminal:
                    done.append(item["requestId"]["S"])
            request = response.get("UnprocessedKeys") or {}
    return done


def _wait_lambda_host(stage: Stage, host: LambdaHost, stall_s: float = 60.0) -> None:
    """Wait until the host has worked through the event and DLQ backlog.

    The host runs one handler at a time, so a big run leaves a long backlog (heartbeat
    events above all); give up only when it stops shrinking.
    """
    queues = [stage.resources.dlq_url, *stage.resources.target_queues.values()]
    last, progress_at = -1, time.monotonic()
    while time.monotonic() - progress_at < stall_s:
        left = sum(sum(stage.queue_counts(url)) for url in queues)
        if left == 0:
            return
        if left != last:
            last, progress_at = left, time.monotonic()
        time.sleep(0.5)
    raise TimeoutError(f"the local Lambda host stopped draining its queues ({last} left)")


# -- the command -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    # A SIGTERM (CI timeout) unwinds through `run`'s cleanup instead of orphaning workers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    config = ChaosConfig(tasks=args.tasks, workers=args.workers, slots=args.slots,
                         seed=args.seed)  # fmt: skip
    report = run(config)
    print_report(report)
    return 1 if report.violations else 0


def print_report(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="chaos: exactly-once under SIGKILL")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in report.summary().items():
        table.add_row(key, str(value))
    console = Console()
    console.print(table)
    for violation in report.violations[:50]:
        console.print(f"[red]violation[/red] {violation}")
    for finding in report.findings[:20]:
        console.print(f"[yellow]finding[/yellow] {finding}")


if __name__ == "__main__":
    sys.exit(main())
