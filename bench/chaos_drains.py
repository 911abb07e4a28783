"""Drain strikes in a --faults chaos run: SIGTERM a worker with a short DRAIN_TIMEOUT.

A worker asked to stop gives back the messages it holds but has not started (buffered
or prefetched: `message given back` in its log) and, once the drain timeout (200 ms
here) lapses, stops its running tasks and releases them (`message settled`, verdict
`released`). Neither failed an attempt, so neither may spend one of the queue's receives:
each message must come back as a fresh copy, which names the message it replaces
(`requeuedFrom`, worker.sqs.batcher), not as the same message made visible again (which
counts one more receive toward the DLQ).

A drain struck while the harness's quota of give-backs lags goes to a worker running a
"bait" task (`plan_bait`: 6 s, longer than a drain's wait for the receiver's long poll,
in which shorter tasks finish), so the drain surely has a running task to release.

The invariant is read from the workers' logs, where every receive is logged with its
message's `requeuedFrom`: every message a drain gave back or released was replaced by
a copy that some worker received. A give-back in place never produces such a copy, so
one drain that gives back anything is enough to see it. A copy whose send failed
(`requeue failed; giving the message back in place`, logged with the message id) is
the designed fallback and is not counted.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.local.workers import WorkerProcess
from bench.chaos_model import ChaosReport, Planned
from bench.stack import envelope

DRAIN_TIMEOUT_MS: Final = 200
BAIT_PREFIX: Final = "chaos-drain-"
BAIT_TASKS: Final = 2
BAIT_SECONDS: Final = 6.0
GIVEN_BACK: Final = "message given back"
RECEIVED: Final = "message received"
REQUEUE_FAILED: Final = "requeue failed; giving the message back in place"
VIOLATION: Final = "drain give-backs not requeued as a fresh copy"


@dataclass(frozen=True, kw_only=True)
class Drain:
    """A worker SIGTERMed and drained, with what its log said between SIGTERM and exit
    (read once, when it exited)."""

    at: float
    worker: str
    worker_id: str
    exit_code: int | None
    # Message id -> `given back` or `released` (`given_back`).
    gave_back: Mapping[str, str]
    # The tasks its log lines name: given back, released, or still being prepared.
    request_ids: frozenset[str]

    @classmethod
    def read(
        cls,
        records: Sequence[Mapping[str, Any]],
        *,
        at: float,
        worker: str,
        worker_id: str,
        exit_code: int | None,
    ) -> Drain:
        named = frozenset(str(r["requestId"]) for r in records
                          if isinstance(r.get("requestId"), str))  # fmt: skip
        return cls(at=at, worker=worker, worker_id=worker_id, exit_code=exit_code,
                   gave_back=given_back(records), request_ids=named)  # fmt: skip


def plan_bait(count: int, side_log: Path) -> list[Planned]:
    """Tasks that run long enough for a drain to find them running (they complete)."""
    return [
        Planned(envelope=envelope("bench-work", {"side_log": str(side_log),
                                                 "seconds": BAIT_SECONDS},
                                  request_id=f"{BAIT_PREFIX}{uuid.uuid4().hex[:12]}"),
                kind="ok")
        for _ in range(count)
    ]  # fmt: skip


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def records_between(path: Path, start: int, end: int) -> list[dict[str, Any]]:
    """The JSON log records a worker wrote between two byte offsets of its log."""
    try:
        with path.open("rb") as log:
            log.seek(start)
            text = log.read(max(0, end - start)).decode(errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return records


def given_back(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Message id -> how it went back (`given back` or `released`), from a drain's log."""
    found: dict[str, str] = {}
    for record in records:
        message_id = record.get("messageId")
        if not isinstance(message_id, str):
            continue
        if record.get("message") == GIVEN_BACK:
            found[message_id] = "given back"
        elif record.get("message") == "message settled" and record.get("verdict") == "released":
            found[message_id] = "released"
    return found


def drain_violations(
    gave_back: Mapping[str, str],
    received: Iterable[Mapping[str, Any]],
) -> tuple[list[str], int]:
    """Every message a drain gave back (`gave_back`: message id -> how) must have been
    replaced by a copy that was received (`received`: every worker's log records).
    Returns the violations and how many give-backs fell back in place (excused)."""
    copies: set[str] = set()
    in_place: set[str] = set()
    for record in received:
        if record.get("message") == RECEIVED and isinstance(record.get("requeuedFrom"), str):
            copies.add(record["requeuedFrom"])
        elif record.get("message") == REQUEUE_FAILED and isinstance(record.get("messageId"), str):
            in_place.add(record["messageId"])
    violations = []
    for message_id, how in sorted(gave_back.items()):
        if message_id in copies or message_id in in_place:
            continue
        violations.append(f"{VIOLATION}: message {message_id} ({how} by a drain): no copy "
                          "naming it was ever received (made visible in place: a receive spent)")  # fmt: skip
    return violations, len(in_place & set(gave_back))


def verify_drains(
    fleet: Sequence[WorkerProcess], drains: Sequence[Drain], report: ChaosReport
) -> None:
    gave_back: dict[str, str] = {}
    for drain in drains:
        gave_back.update(drain.gave_back)
    everything = [record for worker in fleet for record in worker.log_records()]
    found, excused = drain_violations(gave_back, everything)
    report.drains = len(drains)
    report.drain_givebacks = len(gave_back)
    report.drain_givebacks_spent = len(found)
    if excused:
        report.findings.append(f"{excused} drain give-back(s) fell back in place (copy not sent)")
    report.violations.extend(found)
