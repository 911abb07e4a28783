"""Both ends of a fork server's socket: a process that forks children on request and
reports their ends (the worker's fork server, the local stack's launcher), and the
caller that asks it. One message a record on a `SOCK_SEQPACKET` pair: a request with
the child's stdin, stdout and stderr as SCM_RIGHTS descriptors one way; ``pid N`` or
``error WHY``, and ``exit N CODE CPU`` when a child ends (CODE as `Popen.returncode`
has it, CPU its seconds), the other. Standard library only: a fork server is a child
process and imports nothing it need not.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Final, Protocol, TypeVar

# Room for a short request (`fork`) and the longest answer (`exit PID CODE CPU`,
# `error WHY`).
MAX_MESSAGE: Final = 256
# How long a fork may take to be answered (a fork is ~2 ms; a server just started is
# still importing).
ANSWER_TIMEOUT_S: Final = 10.0
# How long an ended child's exit code may take to arrive (the server reaps at SIGCHLD).
EXIT_REPORT_TIMEOUT_S: Final = 5.0
LOST_RETURNCODE: Final = -signal.SIGKILL

T = TypeVar("T")


# -- the server ------------------------------------------------------------------------
def serve(
    sock: socket.socket,
    on_request: Callable[[bytes, list[int]], bytes | T],
    *,
    max_request: int = MAX_MESSAGE,
) -> T | None:
    """Answer requests until the caller's end closes (None). `on_request` gets each
    request and its descriptors (closed after it returns) and returns the answer to send;
    in a child it forked it returns something else, which `serve` returns to the child
    without serving on."""
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
        message, fds, _, _ = socket.recv_fds(sock, max_request, 3)
        if not message:
            return None
        try:
            answer = on_request(message, fds)
            if not isinstance(answer, bytes):
                return answer
            sock.send(answer)
        finally:
            for fd in fds:
                os.close(fd)


def forkable() -> bytes | None:
    """Why this process may not fork a child now (an error answer), or None."""
    if threading.active_count() != 1:
        return b"error the fork server has threads"  # a fork copies no other thread
    return None


def leave_server(sock: socket.socket, fds: list[int]) -> None:
    """In a forked child: the three descriptors as 0-2 and nothing else of the server's
    open (`fds` is emptied). A failure here must not leave a second server serving: the
    child ends."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, source in zip((0, 1, 2), fds, strict=True):
            os.dup2(source, target)
        sock.detach()  # closed with the rest below: its object must not close a reused fd
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        fds.clear()
    except BaseException:
        os._exit(1)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cpu = usage.ru_utime + usage.ru_stime
        sock.send(f"exit {pid} {os.waitstatus_to_exitcode(status)} {cpu:.3f}".encode())


# -- the caller ------------------------------------------------------------------------
class ProcessHandle(Protocol):
    """The part of `subprocess.Popen` the callers of a started process use."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    def terminate(self) -> None: ...


class ForkedProcess(ProcessHandle):
    """A child a fork server forked. Its exit status comes from the server, not from a
    wait of ours."""

    def __init__(
        self,
        pid: int,
        server: ForkServerClient,
        args: list[str],
        pipes: tuple[int, int, int] | None = None,
    ) -> None:
        self.pid = pid
        self.args = args
        self.stdin: IO[bytes] | None = os.fdopen(pipes[0], "wb") if pipes else None
        self.stdout: IO[bytes] | None = os.fdopen(pipes[1], "rb") if pipes else None
        self.stderr: IO[bytes] | None = os.fdopen(pipes[2], "rb") if pipes else None
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, timeout_s=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, timeout_s=timeout)
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


class ForkServerClient:
    """The caller's end of a fork server's socket: one request at a time, its answer,
    and the exit codes (and CPU) of the children as they end."""

    def __init__(self, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self._sock = sock
        self._asking = threading.Lock()  # one request outstanding at a time
        self._changed = threading.Condition()
        self._answers: list[str] = []
        self._codes: dict[int, int] = {}
        self.gone = False
        self.reaped_cpu_s = 0.0  # the CPU of the children that have ended
        self._owner = os.getpid()  # a fork of this process shares the socket, not the server
        threading.Thread(target=self._listen, name="fork-server", daemon=True).start()

    def ask(self, request: bytes, fds: list[int], *, timeout_s: float = ANSWER_TIMEOUT_S) -> int:
        """Send a request with its descriptors: the new child's pid; OSError if refused."""
        with self._asking:
            socket.send_fds(self._sock, [request], fds)
            answer = self._answer(timeout_s)
        kind, _, detail = answer.partition(" ")
        if kind != "pid" or not detail.isdigit():
            raise OSError(f"the fork server refused: {detail or answer}")
        return int(detail)

    def returncode(self, pid: int, *, timeout_s: float | None) -> int | None:
        """`pid`'s exit code once the server reported it, within `timeout_s`; None while
        it runs. A process that has ended is never reported as running: its code may
        still be on its way (a caller resumed from SIGSTOP reads it a moment after the
        child is gone), so that wait is bounded; a code that never comes (the server
        died, and nobody hears an orphan's status) reads as `LOST_RETURNCODE`."""
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
        """End the server (children it forked that wait on their caller read end-of-file)."""
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

    def _answer(self, timeout_s: float) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: self._answers or self.gone, timeout=timeout_s):
                raise OSError("the fork server did not answer")
            if not self._answers:
                raise OSError("the fork server has ended")
            return self._answers.pop(0)

    def _listen(self) -> None:
        while True:
            try:
                message = self._sock.recv(MAX_MESSAGE)
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
    """Whether `pid` has exited: gone, or a zombie (its parent, the server, has not
    reaped it yet, or a PID 1 that reaps nothing holds it)."""
    import psutil  # the caller's side only: a fork server never asks

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
