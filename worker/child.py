"""The child-side runner: ``python -m worker.child TASK_DIR`` (see docs/child-protocol.md).

Runs one attempt of one task and leaves files behind: `artifacts/task-result.json` on
success (exit 0), `error.json` on failure (exit 1). It talks to no AWS service; the
worker reads the files, uploads them and emits every event.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Final

from agentq.config import Settings
from agentq.definitions import TaskDefinition
from agentq.security import sanitize_error_message
from agentq.taxonomy import classify_exception, info
from worker.kinds import ChildContext, load_kind

TASK_FILE: Final = "task.json"
RESULT_FILE: Final = "artifacts/task-result.json"
ERROR_FILE: Final = "error.json"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a worker never reads half a file, even after a kill.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, default=str))
    os.replace(partial, path)


def load_context(task_dir: Path) -> ChildContext:
    task = json.loads((task_dir / TASK_FILE).read_text())
    return ChildContext(
        request_id=task["requestId"],
        tenant=task["tenant"],
        attempt=int(task.get("attempt") or 1),
        job_id=task.get("jobId"),
        definition=TaskDefinition.from_dict(task["definition"]),
        input=task.get("input") or {},
        task_dir=task_dir,
        settings=Settings.from_env(),
    )


def run(task_dir: Path) -> int:
    try:
        ctx = load_context(task_dir)
        for directory in (ctx.artifacts_dir, ctx.logs_dir, ctx.traces_dir):
            directory.mkdir(parents=True, exist_ok=True)
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
        sys.stderr.write(sanitize_error_message(traceback.format_exc(), limit=20_000))
        _write_json(task_dir / ERROR_FILE, classify_exception(exc).to_record())
        return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m worker.child TASK_DIR\n")
        return 2
    return run(Path(args[0]).resolve())


if __name__ == "__main__":
    code = main()
    # Everything the worker reads is written and closed; skip the interpreter's slow
    # teardown (~0.8 s with the SDK imported), which only delays the task's settlement.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
