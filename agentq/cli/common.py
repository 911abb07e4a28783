"""Exit codes and output helpers shared by every `agentq` command.

Exit codes scripts can rely on:

| code | meaning |
|---|---|
| 0 | success (for `--wait`: the task or job completed) |
| 1 | unexpected error |
| 2 | usage error (argparse) |
| 3 | not found (task, job, definition) |
| 4 | the task or job ended failed, timed out or cancelled |
| 5 | configuration error (a required variable is missing or bad) |
| 6 | invalid input (bad spec, bad request id, cycle in a job) |
| 7 | timed out waiting |
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


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def fail(message: str, code: int) -> int:
    sys.stderr.write(f"agentq: {message}\n")
    return code
