"""Running the real `agentq` command line: in this test process (its `main`, under the
environment, directory and streams a shell would give it) or as the installed command.

A command run as a process costs about 1.3 s of CPU (Python, boto3, pydantic, its
clients) and the suite runs a few hundred: in-process it is the same code from
`main(argv)` on, at a tenth of that. Commands that outlive their call or own the
terminal or signals (`console`, `local`, `watch`, `worker`) always run as processes,
and so does any call with `process=True` (the entry point, exit codes a shell sees)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

AGENTQ: Final = shutil.which("agentq", path=str(Path(sys.executable).parent)) or "agentq"
REPO: Final = Path(__file__).resolve().parents[1]
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


# Commands that start servers or workers, draw on a terminal or wait for signals.
PROCESS_COMMANDS: Final = frozenset({"console", "local", "watch", "worker"})


def agentq(
    env: Mapping[str, str],
    *args: str,
    cwd: Path | None = None,
    timeout: float = 120,
    process: bool = False,
) -> Ran:
    """`agentq ARGS` under `env` (the whole environment, as a shell would pass it).
    `timeout` bounds a process; a command run here is bounded by the test's own timeout.
    While it runs, this process's environment is the command's: a thread of the test
    that makes a new AWS client meanwhile would sign with the command's credentials."""
    from agentq.cli import command_of

    if process or command_of(args) in PROCESS_COMMANDS:
        return agentq_process(env, *args, cwd=cwd, timeout=timeout)
    return agentq_in_process(env, *args, cwd=cwd)


def agentq_process(
    env: Mapping[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> Ran:
    """The installed `agentq` command as a child process."""
    done = subprocess.run(
        [AGENTQ, *args], env=dict(env), cwd=cwd, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return Ran(tuple(args), done.returncode, done.stdout, done.stderr)


def agentq_in_process(env: Mapping[str, str], *args: str, cwd: Path | None = None) -> Ran:
    """`agentq.cli.main(args)` here, with `env` as the whole environment, `cwd` as the
    working directory and stdout/stderr captured (no terminal, like a pipe). What the
    interpreter would do with an exception that escapes `main` (print it, exit 1) is
    done here too; the environment and directory are restored afterwards."""
    from agentq.cli import _views, main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    stdout, stderr = _ThisThread(sys.stdout), _ThisThread(sys.stderr)
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        # Rich reads the terminal's width and colour settings from the environment.
        _views.console = _views.make_console()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = _run_main(main, list(args))
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Ran(tuple(args), code, stdout.getvalue(), stderr.getvalue())


class _ThisThread(io.StringIO):
    """Captures what this thread writes; other threads of the test process (a local
    stack's Lambda host, log forwarders) keep writing where they did."""

    def __init__(self, elsewhere: Any) -> None:
        super().__init__()
        self._owner = threading.get_ident()
        self._elsewhere = elsewhere

    def write(self, text: str) -> int:
        if threading.get_ident() == self._owner:
            return super().write(text)
        return int(self._elsewhere.write(text))


def _run_main(main: Any, argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except Exception:
        traceback.print_exc()
        return 1


def one_line_error(ran: Ran) -> str:
    """The failure's single stderr line (fails the test if there is more, or a traceback)."""
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran
    assert lines[0].startswith("agentq: "), ran
    assert "Traceback" not in ran.stderr + ran.stdout, ran
    return lines[0]
