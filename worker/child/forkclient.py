"""The worker's side of the fork server (worker/child/forkserver.py): ask it for a spare, and
learn from it when each spare ends.

`ForkServer.fork` returns a `ForkedProcess` (agentq/forking.py): the part of
`subprocess.Popen` the spare pool and the supervisor use (pid, the three pipes, `poll`,
`wait`, `returncode`). The spare is the server's child, not the worker's, so its exit
status comes from the server. Should the server die, its spares are orphaned and their
statuses lost: a `ForkedProcess` whose process is gone then reads as killed
(`LOST_RETURNCODE`), and the pool starts spares afresh from then on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from agentq.forking import LOST_RETURNCODE, ForkedProcess, ForkServerClient
from worker.child.isolation import ChildUser, popen_options

__all__ = ["FORK_SERVER_COMMAND", "LOST_RETURNCODE", "ForkServer", "ForkedProcess"]

FORK_SERVER_COMMAND: Final = (sys.executable, "-m", "worker.child.forkserver")
# How long a fork may take to be answered (a fork is ~2 ms; a server just started is
# still importing). The pool waits for it under its lock: keep it short.
ANSWER_TIMEOUT_S: Final = 10.0


class ForkServer(ForkServerClient):
    def __init__(self, *, env: Mapping[str, str], cwd: Path, user: ChildUser | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [*FORK_SERVER_COMMAND, str(theirs.fileno())],
                cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(theirs.fileno(),),
                **popen_options(user),
            )  # fmt: skip
        finally:
            theirs.close()
        super().__init__(ours, process)

    def fork(self) -> ForkedProcess:
        """A new spare (it announces itself on its stdout); OSError if the server cannot."""
        child_in, stdin = os.pipe()
        stdout, child_out = os.pipe()
        stderr, child_err = os.pipe()
        try:
            pid = self.ask(b"fork", [child_in, child_out, child_err], timeout_s=ANSWER_TIMEOUT_S)
        except OSError:
            for fd in (stdin, stdout, stderr):
                os.close(fd)
            raise
        finally:
            for fd in (child_in, child_out, child_err):
                os.close(fd)
        return ForkedProcess(pid, self, [*FORK_SERVER_COMMAND, "fork"], (stdin, stdout, stderr))
