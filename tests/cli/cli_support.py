"""Running the real `agentq` command line as a subprocess, the way a user's shell does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

AGENTQ: Final = shutil.which("agentq", path=str(Path(sys.executable).parent)) or "agentq"
REPO: Final = Path(__file__).resolve().parents[2]
# What a stack's environment sets; a "fresh shell" has none of them.
_STACK_PREFIXES: Final = ("AWS_ENDPOINT", "SQS_", "DYNAMODB_", "EVENTBRIDGE_", "S3_BUCKET",
                          "TASK_DEFINITIONS", "AGENTQ_", "TENANT_ID")  # fmt: skip


@dataclass(frozen=True)
class Ran:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return f"agentq {' '.join(self.args)} → {self.code}\n{self.stdout}\n{self.stderr}"


def fresh_shell(**extra: str) -> dict[str, str]:
    """This process's environment without any stack variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STACK_PREFIXES)}
    env["COLUMNS"] = "200"  # one table row per line
    env.update(extra)
    return env


def agentq(
    env: Mapping[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> Ran:
    done = subprocess.run(
        [AGENTQ, *args], env=dict(env), cwd=cwd, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return Ran(tuple(args), done.returncode, done.stdout, done.stderr)


def one_line_error(ran: Ran) -> str:
    """The failure's single stderr line (fails the test if there is more, or a traceback)."""
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran
    assert lines[0].startswith("agentq: "), ran
    assert "Traceback" not in ran.stderr + ran.stdout, ran
    return lines[0]
