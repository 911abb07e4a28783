"""What a chaos run submits: independent tasks, malformed messages and (with --faults)
jobs, plus the AWS fault mix every process of a --faults run injects."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from bench.chaos_model import Kind, Malformed, Planned, PlannedJob
from bench.stack import envelope

# A job of the --faults mode: split → PARTS parts (fan-out) → merge (fan-in).
PARTS: Final = 6
JOB_SIZE: Final = PARTS + 2
# Share of the tasks of a --faults run that belong to jobs.
JOB_SHARE: Final = 0.5

# About 5 % of every AWS call fails, in every kind AWS has (agentq/faults, docs/faults.md).
# Rules are tried in order and the first that fires wins, so the narrow ones come first.
FAULT_RULES: Final[list[dict[str, Any]]] = [
    {"op": "dynamodb:UpdateItem", "kind": "transaction_conflict", "rate": 0.01},
    {"op": "dynamodb:TransactWriteItems", "kind": "transaction_conflict", "rate": 0.02},
    {"op": "events:PutEvents", "kind": "partial_batch", "rate": 0.02},
    {"op": "sqs:SendMessageBatch", "kind": "partial_batch", "rate": 0.02},
    {"op": "sqs:DeleteMessageBatch", "kind": "partial_batch", "rate": 0.02},
    {"op": "sqs:ChangeMessageVisibilityBatch", "kind": "partial_batch", "rate": 0.02},
    {"op": "*", "kind": "applied_then_failed", "rate": 0.015},
    {"op": "*", "kind": "throttle", "rate": 0.015},
    {"op": "*", "kind": "server_error", "rate": 0.008},
    {"op": "*", "kind": "connection_reset", "rate": 0.004},
    {"op": "*", "kind": "read_timeout", "rate": 0.004},
    {"op": "*", "kind": "latency", "rate": 0.004, "delay": 0.3},
]


# One-attempt tasks ("once") carry this in their request id, job tasks their job id's
# prefix: the aimed rules below name them (`match`), so a small run meets, for sure,
# the faults whose mishandling costs a task its only attempt or a job its next step.
ONCE_PREFIX: Final = "chaos-once-"
JOB_PREFIX: Final = "chaos-job-"
AIMED_RULES: Final[list[dict[str, Any]]] = [
    # A finalize (or release) conflicting with the heartbeat's renewal transaction.
    {"op": "dynamodb:UpdateItem", "kind": "transaction_conflict", "rate": 0.25,
     "match": ONCE_PREFIX},
    # A lock, finalize or transition applied, its answer lost, botocore retrying it.
    {"op": "dynamodb:UpdateItem", "kind": "applied_then_failed", "rate": 0.3,
     "match": ONCE_PREFIX},
    # The lock of any task (it sets maxAttempts; a dead letter's return reads it).
    {"op": "dynamodb:UpdateItem", "kind": "applied_then_failed", "rate": 0.3,
     "match": "maxAttempts"},
    # The dispatcher's BLOCKED -> PENDING moves, the job's counts and its close.
    {"op": "dynamodb:UpdateItem", "kind": "applied_then_failed", "rate": 0.15,
     "match": JOB_PREFIX},
]  # fmt: skip


def fault_spec(scale: float = 1.0, first: Sequence[dict[str, Any]] = ()) -> str:
    """AGENTQ_FAULTS for the run: `first` as given, then the aimed rules and the mix
    above, their rates times `scale`."""
    rules = [*first, *({**rule, "rate": min(1.0, rule["rate"] * scale)}
                       for rule in [*AIMED_RULES, *FAULT_RULES])]  # fmt: skip
    return json.dumps({"rules": rules}, separators=(",", ":"))


def plan(count: int, rng: random.Random, side_log: Path) -> list[Planned]:
    kinds: list[Kind] = rng.choices(
        ["ok", "flaky", "permanent", "timeout", "duplicate"],
        weights=[55, 15, 10, 5, 15],
        k=count,
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


def plan_top_up(count: int, rng: random.Random, side_log: Path) -> list[Planned]:
    """Tasks sent to keep the fleet busy while the strike quotas lag (bench.chaos_settle):
    they only succeed and run 1-3 s, so a kill or a freeze finds them running."""
    return [
        Planned(envelope=envelope("bench-work", {"side_log": str(side_log),
                                                 "seconds": rng.uniform(1.0, 3.0)}),
                kind="ok")
        for _ in range(count)
    ]  # fmt: skip


def plan_once(count: int, rng: random.Random, side_log: Path) -> list[Planned]:
    """Tasks of one attempt: an attempt spent without running them, or a finished
    attempt's outcome dropped, fails them (the verdict tells that from a kill)."""
    return [
        Planned(envelope=envelope("bench-once", {"side_log": str(side_log),
                                                 "seconds": rng.uniform(0.1, 0.8)},
                                  request_id=f"{ONCE_PREFIX}{uuid.uuid4().hex[:12]}"),
                kind="once")
        for _ in range(count)
    ]  # fmt: skip


def once_count(tasks: int) -> int:
    """How many one-attempt tasks a --faults run of `tasks` tasks holds."""
    return max(8, tasks // 25)


def job_count(tasks: int) -> int:
    """How many jobs a --faults run of `tasks` tasks holds (at least 2)."""
    return max(2, int(tasks * JOB_SHARE) // JOB_SIZE)


def plan_jobs(count: int, rng: random.Random, side_log: Path, tenant: str) -> list[PlannedJob]:
    """Fan-out/fan-in jobs. Every third job has a part that fails for good, under
    `fail_fast` or `continue` in turn; the others only succeed (some after a retry)."""
    jobs = []
    for n in range(count):
        failing = n % 3 == 2
        policy = "fail_fast" if n % 2 == 0 else "continue"
        kinds: dict[str, Kind] = {"split": "ok", "merge": "ok"}
        tasks: dict[str, Any] = {"split": _task(rng, side_log, "ok")}
        doomed = rng.randrange(PARTS) if failing else -1
        for part in range(PARTS):
            kind: Kind = "permanent" if part == doomed else rng.choice(["ok", "ok", "flaky"])
            kinds[f"part{part}"] = kind
            tasks[f"part{part}"] = _task(rng, side_log, kind, depends_on=["split"])
            # Downstream reads the split's result through the STATE item's pointer: the
            # verdict checks it got the winning attempt's.
            tasks[f"part{part}"]["input"]["upstream"] = "${tasks.split.result.attempt}"
        tasks["merge"] = _task(rng, side_log, "ok", depends_on=[f"part{p}" for p in range(PARTS)])
        job_id = f"{JOB_PREFIX}{uuid.uuid4().hex[:10]}"
        spec = {"name": f"chaos {n}", "failure_policy": policy, "tasks": tasks}
        jobs.append(PlannedJob(job_id=job_id, tenant=tenant, spec=spec, kinds=kinds))
    return jobs


def _task(
    rng: random.Random, side_log: Path, kind: Kind, *, depends_on: list[str] | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"side_log": str(side_log), "seconds": rng.uniform(0.1, 0.8)}
    if kind in ("flaky", "permanent"):
        payload["mode"] = kind
    task: dict[str, Any] = {"definition": "bench-work", "input": payload}
    if depends_on:
        task["depends_on"] = depends_on
    return task


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
