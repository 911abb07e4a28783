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
import logging
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.jobs import task_request_id
from agentq.local.aws import MotoServer
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import WorkerProcess
from bench.chaos_agents import AgentStrikes, plan_agents, verify_agents
from bench.chaos_closeout import (
    CLOSEOUT_TASKS,
    Closeouts,
    closeout_rules,
    plan_closeouts,
    verify_closeouts,
)
from bench.chaos_drains import (
    BAIT_TASKS,
    DRAIN_TIMEOUT_MS,
    plan_bait,
    verify_drains,
)
from bench.chaos_faults import results_document, verify_faults
from bench.chaos_killer import Killer, Strikes
from bench.chaos_model import MARKER, ChaosReport, Freeze, Planned, PlannedJob
from bench.chaos_plan import (
    fault_spec,
    job_count,
    malformed_messages,
    once_count,
    plan,
    plan_jobs,
    plan_once,
    plan_top_up,
)
from bench.chaos_sched import ScheduleMix, mix_size, plan_schedule
from bench.chaos_sched_verify import verify_schedule
from bench.chaos_settle import settle, wait_lambda_host
from bench.chaos_verify import verify
from bench.stack import Stage, moto_server, new_stage, read_side_log, stop_all, worker_env

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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
    # -- --faults: AWS faults, stale holders, skewed clocks, jobs, the reconciler ------
    faults: bool = False
    fault_scale: float = 1.0  # times the mix of bench.chaos_plan.FAULT_RULES (~5 %)
    freeze_share: float = 0.25  # of strikes, on a worker running tasks
    clock_offset_ms: int = 2_000  # w0 runs this far ahead, w1 as far behind
    # Overlap tolerated between two attempts: the offsets above, which equal the
    # documented default skew budget (worker/child/leasefile.py; L/12 with these short leases).
    skew_budget_s: float = 2.0
    reconcile_interval_s: float = 3.0
    reconcile_lost_after_s: int = 20
    reconcile_stall_after_s: int = 10
    # What a run must deliver, however fast it settles: the killer strikes past
    # kill_until_done until both are met (the issue asks 20 and 10 of the full run).
    min_worker_kills: int = 0
    min_stale_holders: int = 0
    # SIGTERM drains (with faults), struck until they gave back this many messages.
    drain_share: float = 0.1
    min_drain_givebacks: int = 2
    # Tasks whose attempts phantom holders spend, closed out by the DLQ (with faults).
    closeouts: int = CLOSEOUT_TASKS
    # Resumable agent tasks (with faults; bench.chaos_agents): the real Claude CLI, two
    # tenants, half of them struck at a turn. Each costs a CLI run or two (seconds of
    # CPU): the command runs 20 with --faults, the tests a few.
    agent_tasks: int = 0

    @property
    def lease_s(self) -> float:
        return self.extension_s * 1.5

    def strikes(self) -> Strikes:
        return Strikes(
            interval_s=self.kill_interval_s,
            child_kill_share=self.child_kill_share,
            freeze_share=self.freeze_share if self.faults else 0.0,
            # Past the lease, and past the clock skew, so another worker takes over.
            freeze_s=self.lease_s + self.skew_budget_s + 2.0,
            min_worker_kills=self.min_worker_kills,
            min_freezes=self.min_stale_holders if self.faults else 0,
            drain_share=self.drain_share if self.faults else 0.0,
            min_drain_givebacks=self.min_drain_givebacks if self.faults else 0,
        )


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
    fault_log = work_dir / "faults.jsonl"
    # The harness's own clients (submit, poll, verify) are built before any fault is
    # configured: only the processes under test see faults.
    stage = new_stage(server, prefix="c")
    stage.set_visibility_timeout(config.visibility_timeout_s)
    run_id = uuid.uuid4().hex[:12]
    agents = plan_agents(config.agent_tasks if config.faults else 0, run_id)
    agents.start_model()
    extra: dict[str, str] = {}
    per_worker: dict[str, dict[str, str]] = {}
    if config.faults:
        extra = {
            "AGENTQ_FAULTS": fault_spec(config.fault_scale, closeout_rules(config.closeouts)),
            "AGENTQ_FAULTS_SEED": str(rng.randrange(2**31)),
            "AGENTQ_FAULTS_LOG": str(fault_log),
            "RECONCILE_LOST_AFTER": str(config.reconcile_lost_after_s),
            "RECONCILE_STALL_AFTER": str(config.reconcile_stall_after_s),
            # The limited tenants' messages park up to 30 s, several of the reconciler's
            # bounds: a parked task whose mark aged would be re-sent, and seen.
            "TENANT_LIMIT_PARK": "30000",
        }
        offset = config.clock_offset_ms
        per_worker = {"w0": {"AGENTQ_TEST_CLOCK_OFFSET_MS": str(offset)},
                      "w1": {"AGENTQ_TEST_CLOCK_OFFSET_MS": str(-offset)}}  # fmt: skip
    env = worker_env(
        stage,
        MAX_CONCURRENT_CLAUDE=str(config.slots),
        VISIBILITY_EXTENSION_INTERVAL=str(config.heartbeat_interval_ms),
        VISIBILITY_EXTENSION_AMOUNT=str(config.extension_s),
        # A drain strike's timeout (SIGTERM): running tasks are released almost at once.
        **({"DRAIN_TIMEOUT": str(DRAIN_TIMEOUT_MS)} if config.faults else {}),
        **{MARKER: run_id},
        **extra,
        **agents.worker_env(work_dir),
    )
    n_jobs = job_count(config.tasks) if config.faults else 0
    jobs = plan_jobs(n_jobs, rng, side_log, tenant=Settings().tenant_id)
    job_tasks = _job_tasks(jobs)
    once = plan_once(once_count(config.tasks), rng, side_log) if config.faults else []
    bait = plan_bait(BAIT_TASKS, side_log) if config.faults else []
    mix = ScheduleMix(stage, plan_schedule(mix_size(config.tasks) if config.faults else 0,
                                           rng, side_log), side_log)  # fmt: skip
    mixed = mix.plan.planned  # tiers, limited tenants, delays, cancels, lost messages
    independent = max(0, config.tasks - len(job_tasks) - len(once) - len(bait) - len(mixed)
                      - len(agents.planned))  # fmt: skip
    planned = [*plan(independent, rng, side_log), *once, *bait]
    bad = malformed_messages(max(1, config.tasks // 20))
    closeouts = Closeouts(stage, plan_closeouts(config.closeouts if config.faults else 0,
                                                rng, side_log),
                          max_attempts=Settings().max_message_retries)  # fmt: skip
    report = ChaosReport(tasks=len(planned) + len(job_tasks) + len(mixed) + len(agents.planned),
                         malformed=len(bad),
                         faults_mode=config.faults, jobs=len(jobs), job_tasks=len(job_tasks),
                         skew_budget_s=config.skew_budget_s if config.faults else 0.0)  # fmt: skip
    if per_worker:
        report.skewed_workers = ", ".join(
            f"{name} {int(env_['AGENTQ_TEST_CLOCK_OFFSET_MS']):+d}"
            for name, env_ in per_worker.items()
            if int(name[1:]) < config.workers
        )
    saved_env = dict(os.environ)
    # The Lambda handlers read it, as on Lambda (and the host's faults with it).
    os.environ.update({**stage.env(), **extra})
    # The handlers log and print EMF metrics to stdout; keep them out of the report. The
    # file stays open: Powertools keeps the stream it saw at import.
    lambda_log = (work_dir / "lambda-host.log").open("a")
    redirect = contextlib.redirect_stdout(lambda_log)
    redirect.__enter__()
    # A handler that raises (AWS faults make them raise often) is logged with its
    # traceback and retried: into the same file, not over the report.
    host_logger = logging.getLogger("agentq.local.lambda_host")
    host_handler = logging.StreamHandler(lambda_log)
    host_logger.addHandler(host_handler)
    host_logger.propagate = False
    began = time.monotonic()
    fleet = [WorkerProcess(f"w{i}", log_dir=work_dir) for i in range(config.workers)]
    killer = Killer(fleet, env, config.strikes(), rng, per_worker)
    strikes = AgentStrikes(stage, agents, fleet)
    host = LambdaHost(stage.resources, Settings.from_env(), health_interval_s=0,
                      reconcile_interval_s=config.reconcile_interval_s if config.faults else 0)  # fmt: skip
    try:
        host.start()
        for worker in fleet:
            killer.start_worker(worker)
        duplicates = [p for p in planned if p.kind == "duplicate"]
        stage.send([p.envelope for p in [*planned, *agents.planned]])
        # Watching for the agent tasks' stalls from their send: at full size the set-up
        # below (jobs, the scheduling mix) takes minutes, past a stalled task's timeout.
        strikes.start()
        _create_jobs(stage, jobs)
        for message in bad:
            stage.send_raw(message.body, message.attributes)
        mix.start(config.visibility_timeout_s)
        closeouts.start()
        killer.start()
        settled = settle(stage, [*planned, *job_tasks, *mixed, *agents.planned], duplicates,
                         killer, config, began,
                         top_up=lambda count: plan_top_up(count, rng, side_log),
                         busy_floor=config.workers * config.slots)  # fmt: skip
        # Verified as every planned task is.
        planned.extend(settled.top_ups)
        report.tasks += len(settled.top_ups)
        report.top_ups = len(settled.top_ups)
        report.unreadable_copies = len(settled.copies)
        report.one_attempt_tasks = len(once)
        killer.stop()
        strikes.stop()
        mix.join()
        closeouts.join()
        # Every queue a worker receives from, the tiers' too: a copy the reconciler re-sent
        # late is still settled (as a duplicate) before the workers stop. Verify reports
        # what is left.
        drain_by = time.monotonic() + 30
        for url in (stage.queue_url, *stage.resources.tier_queues.values()):
            with contextlib.suppress(TimeoutError):
                stage.wait_drained(max(1.0, drain_by - time.monotonic()), url)
        stop_all(fleet)
        try:
            wait_lambda_host(stage, host)
        except TimeoutError as exc:
            report.violations.append(str(exc))
    finally:
        killer.stop()
        strikes.stop()
        mix.stop()
        for worker in fleet:
            if worker.alive():
                worker.kill()
        with contextlib.suppress(Exception):
            host.stop()
        agents.stop_model()
        os.environ.clear()
        os.environ.update(saved_env)
        host_logger.removeHandler(host_handler)
        host_logger.propagate = True
        redirect.__exit__(None, None, None)
    report.seconds = time.monotonic() - began
    report.killing_seconds = killer.seconds
    report.idle_strikes = killer.idle_strikes
    report.stale_holders = len(killer.freezes)
    if not killer.quota_met():
        report.findings.append(
            f"strike quota not met before every task settled: {killer.worker_kills} of "
            f"{config.min_worker_kills} worker kills, {len(killer.freezes)} of "
            f"{config.min_stale_holders} stale holders, {killer.drain_givebacks} of "
            f"{config.min_drain_givebacks if config.faults else 0} drain give-backs"
        )
    (work_dir / "kills.json").write_text(json.dumps([k.__dict__ for k in killer.kills], indent=1))
    freezes = [{**f.__dict__, "request_ids": f.request_ids and sorted(f.request_ids)}
               for f in killer.freezes]  # fmt: skip
    (work_dir / "freezes.json").write_text(json.dumps(freezes, indent=1))
    report.duplicates_sent = len([p for p in planned if p.kind == "duplicate"])
    report.violations.extend(killer.errors)
    runs = read_side_log(side_log)
    # A drain strikes its holder too (a lock still being taken when its 200 ms ran out
    # lapses, its attempt spent as for a kill): a stop that froze nothing, and only for
    # the tasks the drain's own log lines name.
    struck = [*killer.freezes, *(Freeze(at=d.at, until=d.at, worker=d.worker,
                                        worker_id=d.worker_id, pids=(),
                                        request_ids=d.request_ids)
                                 for d in killer.drains)]  # fmt: skip
    planned.extend(mixed)
    verify(stage, planned, bad, runs, killer.kills, fleet, run_id, report,
           freezes=struck, budget_s=report.skew_budget_s, lease_s=config.lease_s)  # fmt: skip
    if config.faults:
        verify_faults(stage, planned, jobs, runs, killer.kills, struck, fleet, report,
                      fault_log=fault_log, max_attempts=Settings().max_message_retries)  # fmt: skip
        verify_closeouts(stage, closeouts, report)
        verify_drains(fleet, killer.drains, report)
        verify_schedule(stage, mix, runs, killer.kills, struck, fleet, report,
                        budget_s=report.skew_budget_s)  # fmt: skip
        verify_agents(stage, agents, report)
    return report


def _job_tasks(jobs: Sequence[PlannedJob]) -> list[Planned]:
    """Job tasks as the settle loop polls them (their envelopes come from the dispatcher)."""
    return [
        Planned(envelope=TaskEnvelope(request_id=task_request_id(job.job_id, key),
                                      tenant=job.tenant, definition="bench-work"), kind=kind)
        for job in jobs
        for key, kind in job.kinds.items()
    ]  # fmt: skip


def _create_jobs(stage: Stage, jobs: Sequence[PlannedJob]) -> None:
    # With the harness's own (fault-free) clients, like a producer outside the test.
    clients = stage.clients
    client = AgentqClient(settings=Settings.from_env(stage.env()), sqs=clients["sqs"],
                          dynamodb=clients["dynamodb"], events=clients["events"],
                          s3=clients["s3"])  # fmt: skip
    for job in jobs:
        client.create_job(job.spec, job_id=job.job_id, tenant=job.tenant)


# -- the command -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--faults", action="store_true",
                        help="AWS faults (~5 %% of calls), stale holders, skewed clocks, jobs")  # fmt: skip
    parser.add_argument("--fault-scale", type=float, default=1.0,
                        help="multiply every fault rate (with --faults)")  # fmt: skip
    parser.add_argument("--min-worker-kills", type=int, default=None,
                        help="keep striking until this many (default 20 with --faults)")  # fmt: skip
    parser.add_argument("--min-stale-holders", type=int, default=None,
                        help="keep striking until this many (default 10 with --faults)")  # fmt: skip
    parser.add_argument("--agent-tasks", type=int, default=20,
                        help="resumable agent tasks, real CLI (with --faults; default 20)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up after (s); default 900, 1800 with --faults")  # fmt: skip
    parser.add_argument("--output", type=Path, default=None,
                        help="results JSON (default bench/results/chaos[-faults].json)")  # fmt: skip
    args = parser.parse_args(argv)
    # A SIGTERM (CI timeout) unwinds through `run`'s cleanup instead of orphaning workers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    config = ChaosConfig(tasks=args.tasks, workers=args.workers, slots=args.slots,
                         seed=args.seed, faults=args.faults, fault_scale=args.fault_scale,
                         agent_tasks=args.agent_tasks,
                         # Strikes every 1-2 s with faults: the quotas (20 worker kills, 10
                         # stale holders) must fit in a run that settles in under 2 minutes
                         kill_interval_s=(1.0, 2.0) if args.faults else (2.0, 5.0),
                         timeout_s=args.timeout or (1800.0 if args.faults else 900.0),
                         min_worker_kills=_default(args.min_worker_kills, 20 if args.faults else 0),
                         min_stale_holders=_default(args.min_stale_holders,
                                                    10 if args.faults else 0))  # fmt: skip
    report = run(config)
    print_report(report)
    output = args.output or RESULTS_DIR / ("chaos-faults.json" if args.faults else "chaos.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    document = results_document(report, command=" ".join(["python -m bench.chaos", *(argv or sys.argv[1:])]),
                                config=config.__dict__)  # fmt: skip
    output.write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"wrote {output}")
    return 1 if report.violations else 0


def _default(given: int | None, default: int) -> int:
    return default if given is None else given


def print_report(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    title = "chaos: exactly-once under SIGKILL" + (
        ", AWS faults, stale holders, skew" if report.faults_mode else ""
    )
    table = Table(title=title)
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
    if report.faults:
        faults = Table(title="AWS faults injected, by kind")
        faults.add_column("kind")
        faults.add_column("count", justify="right")
        for kind, count in sorted(report.faults.items()):
            faults.add_row(kind, str(count))
        console.print(faults)


if __name__ == "__main__":
    sys.exit(main())
