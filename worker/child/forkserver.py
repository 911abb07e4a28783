"""The fork server: one warmed process per worker that forks its plain spares.

A fresh interpreter costs a task about 0.1 s of CPU before its code runs (on the
benchmark machine 115 ms: the interpreter and the standard library the runner imports),
the largest share of a busy local stack's CPU (docs/benchmarks.md). A fork of a process
that has imported it all costs about 2 ms. So a worker keeps one of these, started like
a spare (the same filtered environment, its own session, `CHILD_USER`), and asks it for
each plain spare (worker/child/forkclient.py is the worker's side):

    python -m worker.child.forkserver FD

FD is one end of the socket pair agentq/forking.py speaks: the request is ``fork``.
A forked spare leads its own session with only its three descriptors open, and then
is exactly a spare (`worker.child.serve_spare`): it announces itself, takes one task and
exits. The server exits when the worker's end closes (the worker stopped or died); idle
spares then read end-of-file and exit as well. Agent spares are still started afresh:
the SDK is imported per spare, not here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from agentq.forking import forkable, leave_server, serve


def _become_spare(sock: socket.socket, fds: list[int]) -> None:
    """In the forked child: the spare's life. Never returns."""
    code = 1
    try:
        leave_server(sock, fds)
        from worker.child.runner import serve_spare

        code = serve_spare()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve(sock: socket.socket) -> int:
    def fork_a_spare(message: bytes, fds: list[int]) -> bytes:
        if message != b"fork" or len(fds) != 3:
            return b"error a fork request carries three descriptors"
        refusal = forkable()
        if refusal is not None:
            return refusal
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_spare(sock, fds)
        return f"pid {pid}".encode()

    serve(sock, fork_a_spare)
    return 0  # the worker's end closed


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
