"""The worker's side of the fork server (worker/child/forkserver.py): ask it for a spare, and
learn from it when each spare ends.

`ForkServer.fork` returns a `ForkedProcess`: the part of `subprocess.Popen` the spare
pool and the supervisor use (pid, the three pipes, `poll`, `wait`, `returncode`). The
spare is the server's child, not the worker's, so its exit status comes from the server
(``exit N CODE``). Should the server die, its spares are orphaned and their statuses
lost: a `ForkedProcess` whose process is gone then reads as killed (`LOST_RETURNCODE`),
and the pool starts spares afresh from then on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

import psutil

from worker.child.forkserver import MAX_MESSAGE
from worker.child.isolation import ChildUser, popen_options

FORK_SERVER_COMMAND: Final = (sys.executable, "-m", "worker.child.forkserver")
# How long a fork may take to be answered (a fork is ~2 ms; a server just started is
# still importing). The pool waits for it under its lock: keep it short.
ANSWER_TIMEOUT_S: Final = 10.0
# How long an ended spare's exit code may take to arrive (the server reaps at SIGCHLD).
EXIT_REPORT_TIMEOUT_S: Final = 5.0
LOST_RETURNCODE: Final = -signal.SIGKILL


class ForkedProcess:
    """A spare the fork server forked: what `SparePool` and `run_child` ask of a Popen."""

    def __init__(self, pid: int, server: ForkServer, pipes: tuple[int, int, int]) -> None:
        self.pid = pid
        self.args = [*FORK_SERVER_COMMAND, "fork"]
        self.stdin: IO[bytes] | None = os.fdopen(pipes[0], "wb")
        self.stdout: IO[bytes] | None = os.fdopen(pipes[1], "rb")
        self.stderr: IO[bytes] | None = os.fdopen(pipes[2], "rb")
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


class ForkServer:
    def __init__(self, *, env: Mapping[str, str], cwd: Path, user: ChildUser | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [*FORK_SERVER_COMMAND, str(theirs.fileno())],
                cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(theirs.fileno(),),
                **popen_options(user),
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock = ours
        self._asking = threading.Lock()  # one fork request outstanding at a time
        self._changed = threading.Condition()
        self._answers: list[str] = []
        self._codes: dict[int, int] = {}
        self.gone = False
        threading.Thread(target=self._listen, name="fork-server", daemon=True).start()

    def fork(self) -> ForkedProcess:
        """A new spare (it announces itself on its stdout); OSError if the server cannot."""
        child_in, stdin = os.pipe()
        stdout, child_out = os.pipe()
        stderr, child_err = os.pipe()
        try:
            with self._asking:
                socket.send_fds(self._sock, [b"fork"], [child_in, child_out, child_err])
                answer = self._answer()
        except OSError:
            for fd in (stdin, stdout, stderr):
                os.close(fd)
            raise
        finally:
            for fd in (child_in, child_out, child_err):
                os.close(fd)
        kind, _, detail = answer.partition(" ")
        if kind != "pid" or not detail.isdigit():
            for fd in (stdin, stdout, stderr):
                os.close(fd)
            raise OSError(f"the fork server refused: {detail or answer}")
        return ForkedProcess(int(detail), self, (stdin, stdout, stderr))

    def returncode(self, pid: int, *, timeout_s: float | None) -> int | None:
        """`pid`'s exit code once the server reported it, within `timeout_s`; None while
        it runs. A process that has ended is never reported as running: its code may
        still be on its way (a worker resumed from SIGSTOP reads it a moment after the
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
        """End the server (idle spares it forked read end-of-file from the worker)."""
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
                    pid, _, code = rest.partition(" ")
                    with contextlib.suppress(ValueError):
                        self._codes[int(pid)] = int(code)
                else:
                    self._answers.append(text)
                self._changed.notify_all()


def _ended(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie (its parent, the server, has not
    reaped it yet, or a PID 1 that reaps nothing holds it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
