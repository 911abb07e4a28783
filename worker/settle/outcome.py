"""What an attempt's end means for the task and its message (the seed's table).

| how the child ended                        | STATE     | event                  | message |
|--------------------------------------------|-----------|------------------------|---------|
| exit 0                                     | COMPLETED | Task Completed         | delete  |
| killed by the worker's timeout             | TIMEOUT   | Task Timeout           | delete  |
| stopped by a cancel request                | CANCELLED | Task Cancelled         | delete  |
| failed, retryable, attempts left           | RETRYING  | Task Processing Failed | kept, visible after a jittered backoff |
|   … but a cancel was requested meanwhile   | CANCELLED | Task Cancelled         | delete  |
| failed, retryable, last attempt            | FAILED    | Task Failed            | delete  |
| failed, not retryable (programming, auth…) | FAILED    | Task Failed            | delete  |
| killed by a signal the worker did not send | as a retryable `server` failure (OOM kill, operator)  |
| not started: its lease was about to lapse  | RETRYING  | Task Processing Failed | a fresh copy, no budget spent |
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentq.taxonomy import ErrorInfo, from_record, info
from worker.child.files import plain_file, read_json, read_usage
from worker.child.runner import ERROR_FILE, RESULT_FILE
from worker.child.supervisor import ChildExit

Verdict = Literal["completed", "timeout", "retry", "failed", "released", "lease_lost", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    verdict: Verdict
    error: ErrorInfo | None = None
    usage: dict[str, Any] | None = None
    fenced: bool = False  # the worker stopped it over its lease; the finalize decides
    # The S3 key of this attempt's final session checkpoint (an agent task with resume):
    # a completed task names it on its STATE item for a continuation to start from.
    checkpoint: str | None = None
    # Its tenant stores no transcripts: a completed task says so on its STATE item, so a
    # producer that may not read tenant settings is told why it cannot be continued.
    transcripts_off: bool = False


def backoff_s(attempt: int, *, base_s: float, max_s: float) -> float:
    """Full-jitter exponential backoff: uniform in [base, min(max, base * 2^(attempt-1))]."""
    ceiling = min(max_s, base_s * 2 ** max(0, attempt - 1))
    return random.uniform(min(base_s, ceiling), ceiling)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def decide(child: ChildExit, task_dir: Path, *, attempt: int, max_attempts: int) -> Outcome:
    usage = read_usage(task_dir)
    if child.stopped == "timeout":
        return Outcome(
            verdict="timeout",
            error=info("timeout", f"killed after {child.duration_ms} ms", "TaskTimeout"),
            usage=usage,
        )
    if child.stopped == "lease_lost" and not child.started:
        # The slot reached the task too late to start it inside its lease (renewals
        # failing meanwhile): no task code ran, so this costs the task nothing. As a
        # shutdown's release: a fresh copy, one more attempt allowed (the settler).
        unstarted = info("server", "not started: its lease was about to lapse",
                         "LeaseFenced")  # fmt: skip
        return Outcome(verdict="released", error=unstarted, fenced=True)
    if child.stopped == "lease_lost":
        # Stopped because its lease was lost, or could not be renewed in time (a slow
        # or unreachable DynamoDB). Only the token-conditional finalize can tell which:
        # settle as what happened; a refused finalize leaves the task to its new owner.
        if child.returncode == 0 and plain_file(task_dir / RESULT_FILE):
            return Outcome(verdict="completed", usage=usage, fenced=True)
        fence = info("server", "stopped: its lease was lost or not renewed in time",
                     "LeaseFenced")  # fmt: skip
        verdict: Verdict = "retry" if attempt < max_attempts else "failed"
        return Outcome(verdict=verdict, error=fence, usage=usage, fenced=True)
    if child.stopped == "cancelled":
        # A cancel request stopped it: whatever it wrote, the task ends CANCELLED.
        return Outcome(verdict="cancelled", usage=usage)
    if child.stopped == "shutdown":
        return Outcome(verdict="released", usage=usage)
    if child.returncode == 0:
        if plain_file(task_dir / RESULT_FILE):
            return Outcome(verdict="completed", usage=usage)
        error = info("parse", "child exited 0 without artifacts/task-result.json", "ChildProtocol")
        return Outcome(verdict="failed", error=error, usage=usage)
    record = read_json(task_dir / ERROR_FILE)  # the structured record, never stderr text
    if isinstance(record, dict):
        error = from_record(record)
    elif child.returncode < 0:
        # A signal the worker did not send: the OOM killer, an operator, a host in
        # trouble. Nothing says the task is at fault, so the attempt may be retried.
        name = _signal_name(-child.returncode)
        error = info("server", f"child killed by {name} (out of memory?)", "ChildKilled")
    else:
        error = info(
            "parse",
            f"child exited {child.returncode} without a readable error record",
            "ChildProtocol",
        )
    if error.retryable and attempt < max_attempts:
        return Outcome(verdict="retry", error=error, usage=usage)
    return Outcome(verdict="failed", error=error, usage=usage)
