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
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

import psutil

LAUNCHER_COMMAND: Final = (sys.executable, "-m", "agentq.local.launcher")
# Imported once here, never again in a fork: libraries that read no environment when
# imported (checked: none reads os.environ at module level but psutil's debug flag).
PRELOADED: Final = ("boto3", "botocore.session", "botocore.client", "botocore.config",
                    "pydantic", "pydantic_settings", "psutil", "yaml", "urllib3")  # fmt: skip
# A request carries a whole environment; the answers are short.
MAX_REQUEST: Final = 1 << 20
MAX_ANSWER: Final = 256
ANSWER_TIMEOUT_S: Final = 30.0
EXIT_REPORT_TIMEOUT_S: Final = 5.0
LOST_RETURNCODE: Final = -signal.SIGKILL


# -- the launcher process --------------------------------------------------------------
def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        # With its CPU: the caller's accounting (tools/suite_cpu.py) reaps no fork itself.
        cpu = usage.ru_utime + usage.ru_stime
        sock.send(f"exit {pid} {os.waitstatus_to_exitcode(status)} {cpu:.3f}".encode())


def _serve(sock: socket.socket, base_path: list[str]) -> dict[str, Any] | None:
    """Answer requests until the caller's end closes (None); in a forked child, return
    its request (the child then becomes the process it asked for)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        try:
            ready, _, _ = select.select([sock.fileno(), wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in ready:
            os.read(wake_read, 512)
            _reap(sock)
        if sock.fileno() not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
        if not message:
            return None
        try:
            request = json.loads(message)
            if len(fds) != 3 or not isinstance(request, dict):
                sock.send(b"error a request is a JSON object with three descriptors")
                continue
            if threading.active_count() != 1:
                sock.send(b"error the launcher has threads")  # a fork copies no other
                continue
            pid = os.fork()
            if pid == 0:
                _leave_launcher(sock, fds)
                fds.clear()
                return {**request, "base_path": base_path}
            sock.send(f"pid {pid}".encode())
        except (ValueError, OSError) as exc:
            with contextlib.suppress(OSError):
                sock.send(f"error {exc}"[:MAX_ANSWER].encode())
        finally:
            for fd in fds:
                os.close(fd)


def _leave_launcher(sock: socket.socket, fds: list[int]) -> None:
    """In the fork: the three descriptors as 0-2 and nothing else of the launcher's
    open. A failure here must not leave a second launcher serving: the fork ends."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, source in zip((0, 1, 2), fds, strict=True):
            os.dup2(source, target)
        sock.detach()  # closed with the rest below: its object must not close a reused fd
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    except BaseException:
        os._exit(1)


def _become(request: dict[str, Any]) -> None:
    """In the fork: the requested process's session, directory, environment, import path
    and standard streams; then its module runs as `python -m` runs it."""
    import runpy

    os.setsid()
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
class ProcessHandle(Protocol):
    """What `agentq.local.workers` asks of a process it started: a `Popen`'s part."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    def terminate(self) -> None: ...


class LaunchedProcess(ProcessHandle):
    """A process the launcher forked (its exit status comes from the launcher)."""

    def __init__(self, pid: int, launcher: Launcher, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._launcher = launcher

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._launcher.returncode(self.pid, timeout_s=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._launcher.returncode(self.pid, timeout_s=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Launcher:
    """The caller's end of one launcher process (started on first use)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own environment is not its forks' (they get theirs with each request): a
        # bare one, so no process scanning environments takes the launcher for a task's.
        env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        try:
            self.process = subprocess.Popen(
                [*LAUNCHER_COMMAND, str(theirs.fileno())],
                env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock = ours
        self._asking = threading.Lock()  # one request outstanding at a time
        self._changed = threading.Condition()
        self._answers: list[str] = []
        self._codes: dict[int, int] = {}
        self.gone = False
        self.reaped_cpu_s = 0.0  # the CPU of the forks that have ended
        self._owner = os.getpid()  # a fork of this process shares the socket, not the launcher
        threading.Thread(target=self._listen, name="launcher", daemon=True).start()

    def launch(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdout: int,
        stderr: int,
    ) -> LaunchedProcess:
        """`python -m module args` with this environment and directory, in its own
        session, stdin from /dev/null; OSError if the launcher cannot."""
        request = json.dumps({"module": module, "args": list(args), "env": dict(env),
                              "cwd": str(cwd)}).encode()  # fmt: skip
        with open(os.devnull, "rb") as devnull, self._asking:
            socket.send_fds(self._sock, [request], [devnull.fileno(), stdout, stderr])
            answer = self._answer()
        kind, _, detail = answer.partition(" ")
        if kind != "pid" or not detail.isdigit():
            raise OSError(f"the worker launcher refused: {detail or answer}")
        return LaunchedProcess(int(detail), self, [sys.executable, "-m", module, *args])

    def returncode(self, pid: int, *, timeout_s: float | None) -> int | None:
        """`pid`'s exit code once reported, within `timeout_s`; None while it runs. An
        ended process whose code never comes (the launcher died) reads as killed."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._codes or self.gone, timeout=timeout_s)
            if pid in self._codes:
                return self._codes.pop(pid)
        if not _ended(pid):
            return None
        with self._changed:
            self._changed.wait_for(lambda: pid in self._codes or self.gone,
                                   timeout=EXIT_REPORT_TIMEOUT_S)  # fmt: skip
            return self._codes.pop(pid, LOST_RETURNCODE)

    def close(self) -> None:
        if os.getpid() != self._owner:
            return
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _answer(self) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: self._answers or self.gone,
                                          timeout=ANSWER_TIMEOUT_S):  # fmt: skip
                raise OSError("the worker launcher did not answer")
            if not self._answers:
                raise OSError("the worker launcher has ended")
            return self._answers.pop(0)

    def _listen(self) -> None:
        while True:
            try:
                message = self._sock.recv(MAX_ANSWER)
            except OSError:
                message = b""
            if not message:
                with self._changed:
                    self.gone = True
                    self._changed.notify_all()
                return
            text = message.decode("ascii", "replace")
            kind, _, rest = text.partition(" ")
            with self._changed:
                if kind == "exit":
                    pid, code, cpu = [*rest.split(" "), "0"][:3]
                    with contextlib.suppress(ValueError):
                        self._codes[int(pid)] = int(code)
                        self.reaped_cpu_s += float(cpu)
                else:
                    self._answers.append(text)
                self._changed.notify_all()


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


@dataclass
class Forking:
    """Whether the local stack's Python processes (workers, the IAM-enforced stack's
    Lambda hosts) fork from a launcher. The test suite turns it on (tests/conftest.py);
    the demo, `agentq local up` and the benchmarks' own commands start them afresh, as
    a host does."""

    enabled: bool = False


FORKING: Final = Forking()


def python_module(
    module: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    log: IO[bytes],
    fresh: bool = False,
) -> ProcessHandle:
    """`python -m module args` in its own session, stdin from /dev/null, stdout and
    stderr to `log`: forked from this process's launcher while `FORKING` is on, unless
    `fresh`."""
    directory = cwd or Path.cwd()
    if FORKING.enabled and not fresh:
        return shared_launcher().launch(module, args, env=env, cwd=directory,
                                        stdout=log.fileno(), stderr=log.fileno())  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], env=dict(env), cwd=directory, stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


_shared: dict[int, Launcher] = {}  # by the pid that started it: a fork starts its own
_shared_lock = threading.Lock()


def shared_launcher() -> Launcher:
    """This process's launcher, started on first use and again if it ended."""
    with _shared_lock:
        launcher = _shared.get(os.getpid())
        if launcher is None or launcher.gone or launcher.process.poll() is not None:
            launcher = _shared[os.getpid()] = Launcher()
            atexit.register(launcher.close)  # reaped, as a Popen'd child would be
        return launcher


def launched_cpu_s() -> float:
    """The CPU of the forks this process's launchers reported ended."""
    return sum(launcher.reaped_cpu_s for launcher in _shared.values())


if __name__ == "__main__":
    sys.exit(main())
