"""The fork server: one warmed process per worker that forks its plain spares.

A fresh interpreter costs a task about 0.1 s of CPU before its code runs (on the
benchmark machine 115 ms: the interpreter and the standard library the runner imports),
the largest share of a busy local stack's CPU (docs/benchmarks.md). A fork of a process
that has imported it all costs about 2 ms. So a worker keeps one of these, started like
a spare (the same filtered environment, its own session, `CHILD_USER`), and asks it for
each plain spare (worker/child/forkclient.py is the worker's side):

    python -m worker.child.forkserver FD

FD is one end of a `SOCK_SEQPACKET` socket pair, one message a record:
- worker → server: ``fork`` with three descriptors (SCM_RIGHTS), the new spare's stdin,
  stdout and stderr;
- server → worker: ``pid N`` for each fork (``error WHY`` if it cannot fork), and
  ``exit N CODE`` when a spare it forked has ended (CODE as `Popen.returncode` has it:
  the negated signal for a killed one).

A forked spare leads its own session with only those three descriptors open, and then
is exactly a spare (`worker.child.serve_spare`): it announces itself, takes one task and
exits. The server exits when the worker's end closes (the worker stopped or died); idle
spares then read end-of-file and exit as well. Agent spares are still started afresh:
the SDK is imported per spare, not here.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
from typing import Final

# Room for the longest message either side sends (`exit PID CODE`, `error WHY`).
MAX_MESSAGE: Final = 256


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(f"exit {pid} {os.waitstatus_to_exitcode(status)}".encode())


def _become_spare(fds: list[int]) -> None:
    """In the forked child: its own session, the three descriptors as 0-2, nothing else
    of the server's open; then the spare's life. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, source in zip((0, 1, 2), fds, strict=True):
            os.dup2(source, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        from worker.child.runner import serve_spare

        code = serve_spare()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve(sock: socket.socket) -> int:
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
        message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        if not message:
            return 0  # the worker's end closed
        try:
            if message != b"fork" or len(fds) != 3:
                sock.send(b"error a fork request carries three descriptors")
            elif threading.active_count() != 1:
                # A fork copies no other thread, and so none of the locks they hold.
                sock.send(b"error the fork server has threads")
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become_spare(fds)
                sock.send(f"pid {pid}".encode())
        finally:
            for fd in fds:
                os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m worker.child.forkserver FD\n")
        return 2
    from worker.child.runner import _warm_up

    _warm_up(agent=False)
    return _serve(socket.socket(fileno=int(args[0])))


if __name__ == "__main__":
    sys.exit(main())
