"""The child-side runner: ``python -m worker.child TASK_DIR`` (see docs/child-protocol.md).

``python -m worker.child --spare [--agent]`` is the same runner started ahead of its task
(a warm spare, see worker/child/spares.py; a forked spare, worker/child/forkserver.py, starts at
`serve_spare`): it imports the task kinds (the SDK with ``--agent``), prints
`READY_LINE`, reads
``{"task_dir": ...}`` as one line from stdin and then runs exactly what the first form
runs, in that directory.

It runs once per task, so its imports are on every task's latency: it reads its
settings without the settings model (agentq.config.light) and its definition without
pydantic (`ChildDefinition`); a python task's child never imports pydantic
(tests/unit/test_child_imports.py).

Runs one attempt of one task and leaves files behind: `artifacts/task-result.json` on
success (exit 0), `error.json` on failure (exit 1). It talks to no AWS service; the
worker reads the files, uploads them and emits every event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Final

from agentq.config.light import ChildSettings
from agentq.errors import TaskError
from agentq.security import sanitize_error_message
from agentq.taxonomy import ErrorInfo, classify_exception, info
from worker.child.leasefile import Watchdog
from worker.kinds import ChildContext, ChildDefinition, load_kind

TASK_FILE: Final = "task.json"
RESULT_FILE: Final = "artifacts/task-result.json"
ERROR_FILE: Final = "error.json"
TRACEBACK_LOG: Final = "logs/traceback.txt"
MAX_TRACEBACK_CHARS: Final = 20_000
READY_LINE: Final = b"agentq-spare-ready\n"
MAX_HANDOFF_BYTES: Final = 64 * 1024
# Retryable: the attempt did not fail on its own; its worker stopped renewing the lease.
LEASE_EXPIRED: Final = info(
    "server",
    "the worker stopped renewing this attempt's lease; ended before it lapsed",
    "LeaseExpired",
)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a worker never reads half a file, even after a kill. The lease
    # watchdog's thread may write the same record at the same moment: own temp names.
    partial = path.with_name(f"{path.name}.{threading.get_ident()}.partial")
    partial.write_text(json.dumps(data, default=str))
    os.replace(partial, path)


def load_context(task_dir: Path) -> ChildContext:
    task = json.loads((task_dir / TASK_FILE).read_text())
    return ChildContext(
        request_id=task["requestId"],
        tenant=task["tenant"],
        attempt=int(task.get("attempt") or 1),
        job_id=task.get("jobId"),
        definition=ChildDefinition.from_dict(task["definition"]),
        input=task.get("input") or {},
        task_dir=task_dir,
        settings=ChildSettings.from_env(),
        lease_token=task.get("leaseToken"),
        resume=task.get("resume"),
        follow_up=task.get("followUp"),
    )


def run(task_dir: Path) -> int:
    error_file = task_dir / ERROR_FILE
    # Written before the group is signalled: whatever the task does with its SIGTERM, a
    # worker that reads the files later sees why the attempt ended.
    watchdog = Watchdog(
        task_dir, on_expiry=lambda: _write_json(error_file, LEASE_EXPIRED.to_record())
    ).start()
    try:
        ctx = load_context(task_dir)
        for directory in (ctx.artifacts_dir, ctx.logs_dir, ctx.traces_dir):
            directory.mkdir(parents=True, exist_ok=True)
        refused = (ctx.resume or {}).get("refused")
        if refused:
            # A continuation with nothing to continue from: retrying would not change that.
            raise TaskError("not_found", f"cannot continue: {refused}", retryable=False)
        result = load_kind(ctx.definition.kind).run(ctx)
        try:
            json.dumps(result)
        except (TypeError, ValueError) as exc:
            error = info(
                "programming", f"result is not JSON-serializable: {exc}", type(exc).__name__
            )
            _write_json(task_dir / ERROR_FILE, error.to_record())
            return 1
        _write_json(task_dir / RESULT_FILE, result)
        return 0
    except BaseException as exc:  # every failure must leave a record, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            exc = TimeoutError("interrupted")
        # The worker logs this stderr: the traceback passes the same scrubbing as events.
        text = sanitize_error_message(traceback.format_exc(), limit=MAX_TRACEBACK_CHARS)
        sys.stderr.write(text)
        # A task failing because its lease ran out (its CLI got SIGTERM) did not fail.
        if watchdog.fired.is_set():
            failure: ErrorInfo = LEASE_EXPIRED
        else:
            failure = _located(classify_exception(exc), exc)
            # Uploaded with the attempt's logs: `agentq logs` and the console show it
            # after the worker and its log are gone.
            with contextlib.suppress(OSError):
                (task_dir / TRACEBACK_LOG).parent.mkdir(parents=True, exist_ok=True)
                (task_dir / TRACEBACK_LOG).write_text(text)
        _write_json(error_file, failure.to_record())
        return 1
    finally:
        # Its files are written: a lease lapsing now has no task code left to stop.
        watchdog.close()


def _located(failure: ErrorInfo, exc: BaseException) -> ErrorInfo:
    """The message with where the task's code raised (`file:line in function`), so
    `programming: 'a'` reads as the KeyError it is and says where."""
    frames = traceback.extract_tb(exc.__traceback__)
    # A TaskError's message is the author's; a missing callable is said by its message.
    if not frames or isinstance(exc, TaskError) or failure.category != "programming":
        return failure
    last = frames[-1]
    where = f"{Path(last.filename).name}:{last.lineno} in {last.name}"
    message = sanitize_error_message(f"{failure.message} (at {where})", limit=2_000)
    return dataclasses.replace(failure, message=message)


def _warm_up(*, agent: bool) -> None:
    """Import what tasks need, so a task handed over later does not wait for it.

    The agent kind (the SDK, ~2 s of CPU) only when asked: a worker running python tasks
    would otherwise pay for it once per task.
    """
    import ctypes  # noqa: F401 - the lease timer's (worker/child/leasetimer.py), armed at hand-off

    import worker.kinds.python

    if not agent:
        return
    # A broken SDK install fails the agent tasks themselves, with their own record.
    with contextlib.suppress(Exception):
        import anyio

        import worker.kinds.agent.runner  # noqa: F401

        # The SDK runs on anyio's asyncio backend, which anyio imports on first use.
        anyio.run(_nothing)


async def _nothing() -> None:
    return None


def spare(*, agent: bool = True) -> int:
    _warm_up(agent=agent)
    return serve_spare()


def serve_spare() -> int:
    """A warmed spare's life: announce itself, take one task (or none) and run it."""
    sys.stdout.buffer.write(READY_LINE)
    sys.stdout.buffer.flush()
    line = sys.stdin.buffer.readline(MAX_HANDOFF_BYTES)
    if not line.strip():
        return 0  # the worker closed the pool (or died): there is no task to run
    try:
        task_dir = Path(json.loads(line)["task_dir"]).resolve()
        os.chdir(task_dir)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        sys.stderr.write(f"worker.child --spare: bad task hand-off: {exc}\n")
        return 2
    # From here on the process looks like `python -m worker.child TASK_DIR`: stdin
    # closed, the task dir as cwd, first on sys.path and in argv.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.path[0] = str(task_dir)
    sys.argv[1:] = [str(task_dir)]
    return run(task_dir)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--spare" and set(args[1:]) <= {"--agent"}:
        return spare(agent="--agent" in args)
    if len(args) != 1:
        sys.stderr.write("usage: python -m worker.child TASK_DIR | --spare [--agent]\n")
        return 2
    return run(Path(args[0]).resolve())
