"""`python`-kind tasks of the benchmarks and the chaos harness.

Every task appends to a side log (`input.side_log`) one JSON line when it starts and
one when it ends, each shorter than PIPE_BUF and written with O_APPEND, so lines of
concurrent children never interleave. A SIGTERM (timeout, lost lease) is recorded as an
end with outcome "terminated"; a start line without an end line is an execution that was
SIGKILLed, and the harness bounds it by the earliest record of its end: the kill it
struck, the worker's "fenced child ended" line, or the moment it saw the child gone
after thawing it (a child whose lease lapsed while frozen ends itself as it wakes).

The child's process start time (from /proc) is in the start line too, so a benchmark
can see how long the interpreter took before the task code ran.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from agentq.errors import TaskError


def spawned_at() -> float:
    """Wall-clock time this process was created (10 ms resolution).

    psutil's create_time adds a boot time rounded to whole seconds; computing the age
    from /proc/uptime and the process's start tick keeps sub-second precision.
    """
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        now_since_boot = float(uptime.read().split()[0])
    age = now_since_boot - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def _append(side_log: object, record: Mapping[str, Any]) -> None:
    if not side_log:
        return
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(str(side_log), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class _Execution:
    def __init__(self, payload: Mapping[str, Any], ctx: Any) -> None:
        self.side_log = payload.get("side_log")
        self.base = {"requestId": ctx.request_id, "attempt": ctx.attempt, "pid": os.getpid()}
        # The worker (timeout, lost lease) and the child's lease watchdog end a child
        # with SIGTERM: record the end, then die of it. The handler goes first, so no
        # SIGTERM can end a run whose start is recorded without recording its end.
        signal.signal(signal.SIGTERM, self._terminated)
        self.start = time.time()
        _append(
            self.side_log,
            {**self.base, "event": "start", "t": self.start, "spawned": spawned_at()},
        )  # fmt: skip

    def _terminated(self, signum: int, frame: FrameType | None) -> None:
        self.end("terminated")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def end(self, outcome: str) -> None:
        _append(self.side_log, {**self.base, "event": "end", "t": time.time(), "outcome": outcome})


def work(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Sleeps `seconds`, then behaves as `mode` says.

    mode: ok | flaky (fails with a retryable error on attempts ≤ `fail_times`, default 1)
    | permanent (a non-retryable validation error) | hang (sleeps `seconds` and relies on
    the definition's timeout).
    """
    run = _Execution(payload, ctx)
    mode = str(payload.get("mode", "ok"))
    try:
        time.sleep(float(payload.get("seconds", 0)))
        if mode == "flaky" and ctx.attempt <= int(payload.get("fail_times", 1)):
            raise TaskError("server", f"flaky failure on attempt {ctx.attempt}", retryable=True)
        if mode == "permanent":
            raise TaskError("validation", "permanent failure", retryable=False)
    except BaseException:
        run.end("error")
        raise
    run.end("ok")
    return {"mode": mode, "attempt": ctx.attempt}


def noop(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Nothing but the side log (when one is given)."""
    run = _Execution(payload, ctx)
    run.end("ok")
    return None


if __name__ == "__main__":
    sys.stderr.write("bench.tasks is run by the worker's python kind\n")
