"""The worker launcher: a process that has imported the worker's libraries (boto3,
botocore, pydantic: two thirds of a worker's 1 s of start-up CPU) and forks `python -m
MODULE` processes from itself, for the test suite's ~170 workers (`FORKING`).

    python -m agentq.local.launcher FD

FD is one end of a `SOCK_SEQPACKET` socket pair: a JSON request (module, args, env,
cwd) with its stdin, stdout and stderr as SCM_RIGHTS descriptors one way; ``pid N`` or
``error WHY``, and ``exit N CODE CPU`` when a fork ends, the other. A fork imports
agentq and worker afresh once its environment is in place; unlike a fresh interpreter,
its command line and /proc environ are the launcher's (README, Developing).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from agentq.forking import (
    ForkedProcess,
    ForkServerClient,
    ProcessHandle,
    forkable,
    leave_server,
    serve,
)

__all__ = ["FORKING", "Launcher", "ProcessHandle", "launched_cpu_s", "python_module"]

LAUNCHER_COMMAND: Final = (sys.executable, "-m", "agentq.local.launcher")
# Imported once here, never again in a fork: libraries that read no environment when
# imported (checked: none reads os.environ at module level but psutil's debug flag).
PRELOADED: Final = ("boto3", "botocore.session", "botocore.client", "botocore.config",
                    "pydantic", "pydantic_settings", "psutil", "yaml", "urllib3")  # fmt: skip
# A request carries a whole environment.
MAX_REQUEST: Final = 1 << 20
ANSWER_TIMEOUT_S: Final = 30.0


# -- the launcher process --------------------------------------------------------------
def _serve(sock: socket.socket, base_path: list[str]) -> dict[str, Any] | None:
    """Answer requests until the caller's end closes (None); in a forked child, return
    its request (the child then becomes the process it asked for)."""

    def fork(message: bytes, fds: list[int]) -> bytes | dict[str, Any]:
        try:
            request = json.loads(message)
        except ValueError as exc:
            return f"error {exc}"[:200].encode()
        if len(fds) != 3 or not isinstance(request, dict):
            return b"error a request is a JSON object with three descriptors"
        refusal = forkable()
        if refusal is not None:
            return refusal
        pid = os.fork()
        if pid == 0:
            leave_server(sock, fds)
            return {**request, "base_path": base_path}
        return f"pid {pid}".encode()

    return serve(sock, fork, max_request=MAX_REQUEST)


def _become(request: dict[str, Any]) -> None:
    """In the fork: the requested process's directory, environment, import path and
    standard streams; then its module runs as `python -m` runs it."""
    import runpy

    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *pythonpath, *request["base_path"]]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    # As the interpreter makes them: stderr line-buffered, both unbuffered on request.
    sys.stdout = _text_stream(1, unbuffered, line_buffering=False)
    sys.stderr = _text_stream(2, unbuffered, line_buffering=True)
    sys.argv = [request["module"], *request.get("args", [])]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _text_stream(fd: int, unbuffered: bool, *, line_buffering: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    stream: Any = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(stream, encoding="utf-8", errors="backslashreplace",
                            line_buffering=line_buffering, write_through=unbuffered)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m agentq.local.launcher FD\n")
        return 2
    own = {os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    base_path = [p for p in sys.path if p and p not in own]
    for name in PRELOADED:
        __import__(name)
    request = _serve(socket.socket(fileno=int(args[0])), base_path)
    if request is None:
        return 0
    _become(request)  # its SystemExit ends this interpreter as it would end `python -m`
    return 0


# -- the caller's side -----------------------------------------------------------------
class Launcher(ForkServerClient):
    """The caller's end of one launcher process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own environment is not its forks' (they get theirs with each request): a
        # bare one, so no process scanning environments takes the launcher for a task's.
        env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        try:
            process = subprocess.Popen(
                [*LAUNCHER_COMMAND, str(theirs.fileno())],
                env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )  # fmt: skip
        finally:
            theirs.close()
        super().__init__(ours, process)

    def launch(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdout: int,
        stderr: int,
    ) -> ForkedProcess:
        """`python -m module args` with this environment and directory, in its own
        session, stdin from /dev/null; OSError if the launcher cannot."""
        request = json.dumps({"module": module, "args": list(args), "env": dict(env),
                              "cwd": str(cwd)}).encode()  # fmt: skip
        with open(os.devnull, "rb") as devnull:
            pid = self.ask(request, [devnull.fileno(), stdout, stderr], timeout_s=ANSWER_TIMEOUT_S)
        return ForkedProcess(pid, self, [sys.executable, "-m", module, *args])


@dataclass
class Forking:
    """Whether `WorkerProcess` forks its workers from a launcher. The test suite turns
    it on (tests/conftest.py); the local stack (the demo, `agentq local up`, the
    IAM-enforced tests) and the benchmarks' own commands start them afresh, as a host
    does."""

    enabled: bool = False


FORKING: Final = Forking()


def python_module(
    module: str, *, env: Mapping[str, str], cwd: Path, log: IO[bytes], fresh: bool = False
) -> ProcessHandle:
    """`python -m module` in its own session, stdin from /dev/null, stdout and stderr to
    `log`: forked from this process's launcher while `FORKING` is on, unless `fresh`."""
    if FORKING.enabled and not fresh:
        return shared_launcher().launch(module, env=env, cwd=cwd, stdout=log.fileno(),
                                        stderr=log.fileno())  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", module], env=dict(env), cwd=cwd, stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


# Every launcher started, by the pid that started it (a fork of the caller starts its
# own); the last of each is the one in use.
_started: dict[int, list[Launcher]] = {}
_started_lock = threading.Lock()


def shared_launcher() -> Launcher:
    """This process's launcher, started on first use and again if it ended."""
    with _started_lock:
        mine = _started.setdefault(os.getpid(), [])
        if not mine or mine[-1].gone or mine[-1].process.poll() is not None:
            mine.append(Launcher())
            atexit.register(mine[-1].close)  # reaped, as a Popen'd child would be
        return mine[-1]


def launched_cpu_s() -> float:
    """The CPU of the forks this process's launchers reported ended."""
    return sum(launcher.reaped_cpu_s for launcher in _started.get(os.getpid(), []))


if __name__ == "__main__":
    sys.exit(main())
