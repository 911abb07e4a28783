"""Small `python`-kind tasks for tests, benchmarks, the chaos harness and the demo.

Registered by definitions/testing/samples.yaml. Every sample accepts an optional
``side_log`` input: a file path to which it appends one JSON line
``{"requestId", "attempt", "pid", "start", "end"}`` per run, so a harness can count
how often a task really ran, independently of queues and events.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from agentq.errors import TaskError
from agentq.taxonomy import RETRYABLE

Sample = Callable[[Mapping[str, Any], Any], Any]


def _side_logged(function: Sample) -> Sample:
    @functools.wraps(function)
    def wrapper(payload: Mapping[str, Any], ctx: Any) -> Any:
        side_log = payload.get("side_log")
        start = time.time()
        try:
            return function(payload, ctx)
        finally:
            if side_log:
                line = {
                    "requestId": ctx.request_id,
                    "attempt": ctx.attempt,
                    "pid": os.getpid(),
                    "start": start,
                    "end": time.time(),
                }
                # O_APPEND writes of one short line do not interleave between processes.
                with Path(str(side_log)).open("a") as handle:
                    handle.write(json.dumps(line) + "\n")

    return wrapper


@_side_logged
def echo(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Returns its input (minus harness options)."""
    return {k: v for k, v in payload.items() if k != "side_log"}


@_side_logged
def noop(payload: Mapping[str, Any], ctx: Any) -> Any:
    return None


@_side_logged
def sleep(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Sleeps `seconds` (default 1) and reports how long it slept."""
    seconds = float(payload.get("seconds", 1))
    time.sleep(seconds)
    return {"slept": seconds}


@_side_logged
def fail(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Fails with `category` on the first `times` attempts (default: every attempt).

    The attempt number comes from the STATE item via task.json, so "fail once" means
    once per task, whichever worker runs the retry. With `wait_file` it first waits
    (at most `wait_s`, default 60) for that file to exist: a test decides when it ends.
    """
    wait_file = payload.get("wait_file")
    if wait_file:
        deadline = time.monotonic() + float(payload.get("wait_s", 60))
        while not Path(str(wait_file)).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    category = str(payload.get("category", "server"))
    times = payload.get("times")
    if times is None or ctx.attempt <= int(times):
        if category == "programming":
            raise TypeError(str(payload.get("message", "sample programming error")))
        raise TaskError(
            category,
            str(payload.get("message", f"sample {category} failure on attempt {ctx.attempt}")),
            retryable=category in RETRYABLE,
            exception_type="SampleFailure",
        )
    return {"succeededOnAttempt": ctx.attempt}


_STUBBORN: Final = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@_side_logged
def grandchild(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Starts a grandchild that ignores SIGTERM (like a CLI that traps it), then sleeps.

    The grandchild writes its pid to `pid_file` so a test can prove it was killed.
    """
    pid_file = str(payload.get("pid_file") or ctx.task_dir / "grandchild.pid")
    seconds = float(payload.get("seconds", 60))
    subprocess.Popen([sys.executable, "-c", _STUBBORN, pid_file, str(seconds)])
    # The child ignores SIGTERM too, so only the worker's SIGKILL ends this attempt.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return {"survived": True}


@_side_logged
def chatter(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Prints `lines` lines of `width` characters to stdout (and every 10th to stderr)."""
    lines = int(payload.get("lines", 1000))
    width = int(payload.get("width", 80))
    for index in range(lines):
        text = f"line {index} " + "x" * max(0, width - 12)
        print(text, file=sys.stderr if index % 10 == 9 else sys.stdout, flush=False)
    sys.stdout.flush()
    return {"lines": lines}


@_side_logged
def environment(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Returns the names of the child's environment variables (values stay private)."""
    return {"names": sorted(os.environ)}


@_side_logged
def print_environment(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Prints every variable of the child's environment with its value to stdout, as a
    careless (or prompt-injected) task would; the worker must scrub what it copies."""
    for name, value in sorted(os.environ.items()):
        print(f"{name}={value}")
    sys.stdout.flush()
    return {"printed": len(os.environ)}


@_side_logged
def write_artifact(payload: Mapping[str, Any], ctx: Any) -> Any:
    """Writes `files` ({relative name: text}) in its task directory and makes `fifos`
    (names) there; returns the files' names and `echo` (so a result can tell whose task
    produced it). With `exit_code`, the process exits with it instead of returning: the
    files are then all the worker has (a task that writes its own error.json)."""
    files = payload.get("files") or {"artifacts/extra.txt": "hello"}
    for name in [*files, *payload.get("fifos", [])]:
        target = (ctx.task_dir / str(name)).resolve()
        if ctx.task_dir.resolve() not in target.parents:
            raise ValueError(f"{name} is outside the task directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        if name in files:
            target.write_text(str(files[name]))
        else:
            os.mkfifo(target)
    if "exit_code" in payload:
        sys.stdout.flush()
        os._exit(int(payload["exit_code"]))
    return {"files": sorted(files), "echo": payload.get("echo")}
