"""Exit codes and output helpers shared by every `agentq` command.

Exit codes scripts can rely on:

| code | meaning |
|---|---|
| 0 | success (for `--wait`: the task or job completed) |
| 1 | unexpected error (one line on stderr; `agentq --debug` shows the traceback) |
| 2 | usage error (argparse) |
| 3 | not found (task, job, definition, result) |
| 4 | the task or job ended failed, timed out or cancelled |
| 5 | configuration error (a required variable is missing or bad, no credentials) |
| 6 | invalid input (bad spec, bad request id, cycle in a job) |
| 7 | timed out waiting |
| 8 | AWS unreachable, or the stage's resources are not there (local stack stopped?) |

Every failure ends with one line on stderr saying what happened and what to do; a
command run with `--json` also prints `{"error": {"code", "kind", "message", "hint"}}`
on stdout (unless it already printed its own JSON document).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_TASK_FAILED: Final = 4
EXIT_CONFIG: Final = 5
EXIT_INVALID: Final = 6
EXIT_WAIT_TIMEOUT: Final = 7
EXIT_UNREACHABLE: Final = 8

_KINDS: Final = {
    EXIT_ERROR: "error",
    EXIT_NOT_FOUND: "not_found",
    EXIT_TASK_FAILED: "task_failed",
    EXIT_CONFIG: "config",
    EXIT_INVALID: "invalid",
    EXIT_WAIT_TIMEOUT: "wait_timeout",
    EXIT_UNREACHABLE: "unreachable",
}

# A person at a prompt should hear about a dead endpoint in seconds, not after a
# worker's patience (5 attempts, 40 s reads); `watch` and `--wait` poll in short calls.
CLI_AWS_CONFIG: Final = {"connect_timeout": 3, "read_timeout": 20, "max_attempts": 3}


class _Output:
    json = False
    emitted = False


output = _Output()


def emit_json(data: Any) -> None:
    output.emitted = True
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def fail(message: str, code: int, *, hint: str = "", kind: str | None = None) -> int:
    line = f"{message} — {hint}" if hint else message
    sys.stderr.write(f"agentq: {line}\n")
    if output.json and not output.emitted:
        emit_json({"error": {"code": code, "kind": kind or _KINDS.get(code, "error"),
                             "message": message, "hint": hint}})  # fmt: skip
    return code
