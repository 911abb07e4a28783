"""Exit codes and output helpers shared by every `agentq` command.

The exit codes scripts rely on (0 success, 1 unexpected, 2 usage, 3 not found, 4 the
task or job ended unsuccessfully, 5 configuration, 6 invalid input, 7 timed out waiting,
8 AWS unreachable) are listed in docs/producers.md. Every failure ends with one line on
stderr saying what to do; with `--json` also `{"error": {"code", "kind", "message",
"hint"}}` on stdout, unless the command already printed its own JSON document.
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
