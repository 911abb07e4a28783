"""Resumable agent tasks in a chaos run (--faults): struck at a turn, verified after.

`ChaosConfig.agent_tasks` tasks of `chaos-agent` (`resume: true`, two tenants) run the
real Claude CLI against the offline model server: STEPS shell steps, then the answer.
Every other one stalls on turn KILL_TURN of its first attempt, and `AgentStrikes`
SIGKILLs its child (the CLI with it) once those turns' checkpoint is in S3; random
strikes and AWS faults hit them like any task. `verify_agents` checks each: one
terminal state and event; COMPLETED by one winner whose result and final checkpoint
pointer lie under its attempt's prefix; a winner after a checkpointed attempt resumed
from one or says why not; no checkpoint of one tenant under, or readable as, another's
(docs/benchmarks/chaos.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from agentq.checkpoints import CheckpointError, decode, is_checkpoint_key, part_key, read_attempt
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.errors import AgentqError, NotFound
from agentq.jobs import ResultReader
from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess
from agentq.states import TaskState
from agentq.store.events import EventStore
from agentq.store.keys import CHECKPOINT_NAME, attempt_prefix, checkpoint_key
from agentq.store.tasks import TaskRecord, TaskStore
from bench.chaos_model import TERMINAL_EVENTS, AgentVerdict, ChaosReport, Planned
from bench.stack import BENCH_DEFINITIONS, Stage

DEFINITION: Final = "chaos-agent"
TENANTS: Final = ("agents-a", "agents-b")
STEPS: Final = 4
KILL_TURN: Final = 2  # a struck task's first attempt stalls with this many turns done
# Each turn's checkpoint reaches S3 within this: the strike waits for it.
CHECKPOINT_INTERVAL_MS: Final = 200
SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["done"],
    "properties": {"done": {"type": "array", "minItems": 1, "items": {"type": "string"}}},
}


def definition() -> dict[str, Any]:
    return {
        "name": DEFINITION,
        "kind": "agent",
        # A stall no strike ended times out and is retried like any deadline.
        "timeout_s": 60,
        # Strikes, freezes and drains spend attempts faster than a CLI run finishes.
        "max_attempts": 8,
        "settings": {
            "prompt": "Work through the steps below, one shell command each.\n\n{steps}",
            "output_schema": SCHEMA,
            "allowed_tools": ["Bash"],
            "max_turns": STEPS + 4,
            "step_timeout_s": 60,
            "retry_attempts": 1,
            "retry_backoff_s": 0.2,
            "retry_backoff_max_s": 1,
            "resume": True,
        },
    }


def steps_text(request_id: str, *, struck: bool) -> str:
    tools = "; ".join(f'tool Bash {{"command": "echo {request_id}-step-{n}"}}'
                      for n in range(1, STEPS + 1))  # fmt: skip
    stall = f"; stall x1 turn {KILL_TURN}" if struck else ""
    return f"[[model: key {request_id}; {tools}{stall}]]"


@dataclass(frozen=True, kw_only=True)
class AgentStrike:
    at: float
    request_id: str
    attempt: int
    turns: int  # in the attempt's checkpoint when it was struck
    pids: tuple[int, ...]


@dataclass
class AgentMix:
    """The run's agent tasks, the model server they talk to, and the strikes aimed at them."""

    planned: list[Planned]
    struck: frozenset[str]  # request ids scripted to stall at KILL_TURN
    model: ModelServer | None = None
    strikes: list[AgentStrike] = field(default_factory=list)

    def start_model(self) -> None:
        """The offline model server, for the run (none without agent tasks)."""
        if self.planned and self.model is None:
            self.model = ModelServer().start()

    def stop_model(self) -> None:
        if self.model is not None:
            self.model.stop()

    def worker_env(self, scratch: Path) -> dict[str, str]:
        """What a worker needs to run them: the definition, the CLI's offline env."""
        if self.model is None:
            return {}
        definitions = scratch / "agent-definitions"
        definitions.mkdir(parents=True, exist_ok=True)
        (definitions / f"{DEFINITION}.yaml").write_text(
            yaml.safe_dump([definition()], sort_keys=False)
        )
        home = scratch / "agent-home"
        dirs = (BENCH_DEFINITIONS, SAMPLE_DEFINITIONS, definitions)
        return {
            **offline_claude_env(self.model.url, home),
            "HOME": str(home),
            "TASK_DEFINITIONS_DIR": os.pathsep.join(str(d) for d in dirs),
            "AGENT_CHECKPOINT_INTERVAL": str(CHECKPOINT_INTERVAL_MS),
        }


def plan_agents(count: int, run_id: str) -> AgentMix:
    """`count` tasks, alternating tenants; every other one struck at KILL_TURN."""
    planned, struck = [], set()
    for n in range(count):
        rid = f"ca-{run_id}-{n:03d}"
        hit = n % 2 == 0
        if hit:
            struck.add(rid)
        task = TaskEnvelope(request_id=rid, tenant=TENANTS[n % 2], definition=DEFINITION,
                            input={"steps": steps_text(rid, struck=hit)})  # fmt: skip
        planned.append(Planned(envelope=task, kind="agent"))
    return AgentMix(planned=planned, struck=frozenset(struck))


class AgentStrikes:
    """SIGKILLs each struck task's child once its model stalls with KILL_TURN turns
    checkpointed (the stall is the model's latest request: nothing else ended it)."""

    def __init__(self, stage: Stage, mix: AgentMix, fleet: Sequence[WorkerProcess]) -> None:
        self._stage, self._mix, self._fleet = stage, mix, fleet
        self._pending = {p.envelope.request_id: p.envelope.tenant for p in mix.planned
                         if p.envelope.request_id in mix.struck}  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agent-strikes", daemon=True)

    def start(self) -> None:
        if self._pending and self._mix.model is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        store = TaskStore(self._stage.clients["dynamodb"], self._stage.resources.table_name)
        while self._pending and not self._stop.wait(0.2):
            for rid, tenant in list(self._pending.items()):
                with contextlib.suppress(Exception):  # a strike is retried on the next pass
                    self._try(store, rid, tenant)

    def _try(self, store: TaskStore, rid: str, tenant: str) -> None:
        assert self._mix.model is not None
        requests = self._mix.model.requests(rid)
        record = store.get(tenant, rid)
        if record is None:
            return  # not received yet
        if record.state.terminal:
            self._pending.pop(rid, None)  # ended before its stall was struck
            return
        if not requests or requests[-1].outcome != "stall":
            if any(r.outcome == "stall" for r in requests):
                self._pending.pop(rid, None)  # its stall ended otherwise (a random strike)
            return
        turns = _checkpoint_turns(self._stage, tenant, rid, record.attempt)
        if turns < KILL_TURN:
            return
        pids = [pid for worker in self._fleet for pid in worker.kill_task(rid)]
        if pids:
            self._mix.strikes.append(AgentStrike(at=time.time(), request_id=rid,
                                                 attempt=record.attempt, turns=turns,
                                                 pids=tuple(pids)))  # fmt: skip
            self._pending.pop(rid, None)


def _checkpoint_turns(stage: Stage, tenant: str, rid: str, attempt: int) -> int:
    """Turns in the newest checkpoint at or below `attempt`, as its retry would read it: an
    attempt that resumed and stalled before a turn of its own has only the earlier one.
    -1 when there is none (or an unreadable one)."""
    for earlier in range(attempt, 0, -1):
        try:
            found = read_attempt(stage.clients["s3"], stage.resources.bucket, tenant, rid,
                                 earlier)  # fmt: skip
        except CheckpointError:
            return -1
        if found is not None:
            return decode(found.data).turns
    return -1


# -- verifying ---------------------------------------------------------------------------
def verify_agents(stage: Stage, mix: AgentMix, report: ChaosReport) -> None:
    """Every agent task's invariants (see the module docstring), into `report.agents`."""
    if not mix.planned:
        return
    verdict = AgentVerdict(tasks=len(mix.planned), struck=len(mix.strikes))
    ddb, table = stage.clients["dynamodb"], stage.resources.table_name
    store = TaskStore(ddb, table)
    events = EventStore(ddb, table, app_name=stage.resources.names.app_name)
    s3 = stage.clients["s3"]
    results = ResultReader(s3, stage.resources.bucket)
    checkpoints = _checkpoint_keys(stage)
    for item in mix.planned:
        env = item.envelope
        record = store.get(env.tenant, env.request_id)
        timeline = events.timeline(env.tenant, env.request_id)
        _check_task(env, record, timeline, (s3, results), checkpoints, verdict, report)
    _check_tenants(stage, mix, checkpoints, verdict, report)
    report.agents = verdict.__dict__.copy()


def _checkpoint_keys(stage: Stage) -> dict[str, list[str]]:
    """Every checkpoint object's key in the bucket (whole ones and parts), by the tenant
    folder it lies under."""
    found: dict[str, list[str]] = {}
    pages = (
        stage.clients["s3"]
        .get_paginator("list_objects_v2")
        .paginate(Bucket=stage.resources.bucket, Prefix="task/")
    )
    for page in pages:
        for obj in page.get("Contents", []):
            key = str(obj["Key"])
            if is_checkpoint_key(key):
                found.setdefault(key.split("/")[1], []).append(key)
    return found


def _check_task(
    env: TaskEnvelope,
    record: TaskRecord | None,
    timeline: Sequence[Mapping[str, Any]],
    readers: tuple[Any, ResultReader],
    checkpoints: Mapping[str, Sequence[str]],
    verdict: AgentVerdict,
    report: ChaosReport,
) -> None:
    rid, violations = env.request_id, report.violations
    s3, results = readers
    if record is None or not record.state.terminal:
        verdict.not_terminal += 1
        violations.append(f"{rid} (agent): not terminal: {record and record.state.value}")
        return
    terminal = [e for e in timeline if e.get("detailType") in TERMINAL_EVENTS]
    if len(terminal) > 1 or (
        terminal and TERMINAL_EVENTS[str(terminal[0]["detailType"])] is not record.state
    ):
        verdict.winners_not_one += 1
        seen = [(e.get("detailType"), e.get("attempt")) for e in terminal]
        violations.append(f"{rid} (agent): {record.state.value}, terminal events {seen}")
    if record.state is not TaskState.COMPLETED:
        # Kills, freezes and faults may use up its attempts or receives: a fair end.
        verdict.failed_by_chaos += 1
        report.findings.append(f"{rid} (agent): {record.state.value} after {record.attempt} "
                               f"attempt(s): {record.raw.get('error')}")  # fmt: skip
        return
    verdict.completed += 1
    winner = attempt_prefix(env.tenant, rid, record.attempt)
    end = terminal[0] if terminal else None
    if end is not None and end.get("attempt") != record.attempt:
        verdict.winners_not_one += 1
        violations.append(f"{rid} (agent): COMPLETED by attempt {record.attempt}, its "
                          f"Task Completed says attempt {end.get('attempt')}")  # fmt: skip
    _check_result(rid, record, winner, results, verdict, report)
    _check_checkpoint(rid, record, winner, checkpoints.get(env.tenant, ()), verdict, report)
    resume = _resume_record(record, end, s3, results)
    _check_resume(rid, record, resume, checkpoints.get(env.tenant, ()), verdict, report)


def _check_result(
    rid: str,
    record: TaskRecord,
    winner: str,
    results: ResultReader,
    verdict: AgentVerdict,
    report: ChaosReport,
) -> None:
    try:
        key = results.pointer(record)[1]
        result = results.load(record)
    except AgentqError as error:
        verdict.results_not_winners += 1
        report.violations.append(f"{rid} (agent): COMPLETED, its result unreadable: {error}")
        return
    if not key.startswith(winner) or not (isinstance(result, Mapping) and result.get("done")):
        verdict.results_not_winners += 1
        report.violations.append(f"{rid} (agent): COMPLETED by attempt {record.attempt}, "
                                 f"its result {key} is not that attempt's answer")  # fmt: skip


def _check_checkpoint(
    rid: str,
    record: TaskRecord,
    winner: str,
    tenant_keys: Sequence[str],
    verdict: AgentVerdict,
    report: ChaosReport,
) -> None:
    stored = record.raw.get("checkpoint")
    key = stored.get("key") if isinstance(stored, Mapping) else None
    if key is None:
        # The winner's last upload failed (an S3 fault): nothing to continue from, which
        # continue refuses by name. Not a wrong checkpoint; counted.
        verdict.no_final_checkpoint += 1
        report.findings.append(f"{rid} (agent): COMPLETED without a final checkpoint pointer")
        return
    if key != winner + CHECKPOINT_NAME or key not in tenant_keys:
        verdict.checkpoints_not_winners += 1
        report.violations.append(f"{rid} (agent): COMPLETED by attempt {record.attempt}, its "
                                 f"checkpoint pointer names {key}")  # fmt: skip


def _check_resume(
    rid: str,
    record: TaskRecord,
    resume: Mapping[str, Any] | None,
    tenant_keys: Sequence[str],
    verdict: AgentVerdict,
    report: ChaosReport,
) -> None:
    """A winner after an attempt that left a checkpoint resumed from one, or says why not."""
    left = [a for a in range(1, record.attempt + 1)
            if {part_key(record.tenant, rid, a, 1), checkpoint_key(record.tenant, rid, a)}
            & set(tenant_keys)]  # fmt: skip
    earlier = [a for a in left if a < record.attempt]
    status = resume.get("status") if resume else None
    if resume is not None and status == "resumed":
        verdict.resumed += 1
        if resume.get("from_attempt") not in left:
            verdict.resumes_unexplained += 1
            report.violations.append(f"{rid} (agent): attempt {record.attempt} says it "
                                     f"resumed from attempt {resume.get('from_attempt')}, "
                                     f"which left no checkpoint ({left})")  # fmt: skip
        return
    if not earlier:
        return  # nothing to resume from: a first attempt, or attempts that never checkpointed
    if status in ("fresh", "off") and resume is not None and resume.get("reason"):
        verdict.resumed_fresh += 1
        report.findings.append(f"{rid} (agent): attempt {record.attempt} started afresh "
                               f"after attempt {earlier[-1]}'s checkpoint: "
                               f"{resume['reason']}")  # fmt: skip
        return
    verdict.resumes_unexplained += 1
    report.violations.append(f"{rid} (agent): attempt {record.attempt} followed attempt "
                             f"{earlier[-1]}'s checkpoint but neither resumed nor said why "
                             f"(resume record {resume})")  # fmt: skip


def _resume_record(
    record: TaskRecord, end: Mapping[str, Any] | None, s3: Any, results: ResultReader
) -> Mapping[str, Any] | None:
    """The winner's resume record: its Task Completed event's, else (the event lost to a
    kill) its trace's; None when neither has one."""
    payload = end.get("payload") if end is not None else None
    stored = payload.get("resume") if isinstance(payload, Mapping) else None
    if isinstance(stored, Mapping):
        return stored
    trace = results.files(record).get("traces/session_trace.json")
    if trace is None:
        return None
    body = s3.get_object(Bucket=results.bucket, Key=trace)["Body"].read()
    found = json.loads(body).get("resume")
    return found if isinstance(found, Mapping) else None


def _check_tenants(
    stage: Stage,
    mix: AgentMix,
    checkpoints: Mapping[str, Sequence[str]],
    verdict: AgentVerdict,
    report: ChaosReport,
) -> None:
    """No checkpoint of one tenant's task lies under another's folder, and reading a
    task of one tenant as the other finds nothing (its conversation and its result)."""
    owner = {p.envelope.request_id: p.envelope.tenant for p in mix.planned}
    for folder, keys_ in checkpoints.items():
        for key in keys_:
            rid = key.split("/")[2]
            if owner.get(rid, folder) != folder:
                verdict.cross_tenant += 1
                report.violations.append(f"{rid} of {owner[rid]}: a checkpoint under {folder}'s "
                                         f"prefix: {key}")  # fmt: skip
    clients = stage.clients
    client = AgentqClient(settings=Settings.from_env(stage.env()), sqs=clients["sqs"],
                          dynamodb=clients["dynamodb"], events=clients["events"],
                          s3=clients["s3"])  # fmt: skip
    for item in mix.planned:
        rid, tenant = item.envelope.request_id, item.envelope.tenant
        other = next(t for t in TENANTS if t != tenant)
        for what, read in (("conversation", client.conversation), ("result", client.result)):
            verdict.cross_tenant_reads += 1
            try:
                read(rid, tenant=other)
            except NotFound:
                continue
            except AgentqError as error:
                verdict.cross_tenant += 1
                report.violations.append(f"{rid} of {tenant}: its {what} read as {other}: "
                                         f"{type(error).__name__}, not not-found")  # fmt: skip
            else:
                verdict.cross_tenant += 1
                report.violations.append(f"{rid} of {tenant}: its {what} readable as {other}")
