"""moto's servers, each in a process of its own on a free loopback port.

DynamoDB gets a server to itself, every other service shares one. On AWS a DynamoDB
write does not wait for an SQS receive, a queue scan or an EventBridge delivery; in one
moto process it does, for the interpreter's lock, and every task's lock (a conditional
DynamoDB write) waited behind whatever queue work the other workers made. In the
tenant-limit benchmark (docs/benchmarks.md) B's and C's p95 waits beside a flooding
tenant fell from 0.35 s to about 0.25 s with DynamoDB apart, the idle run's stayed at
0.10 s.

With IAM enforced (agentq.local.moto_iam) there is one process: the users and
policies live in the server that checks them.

Both are started through agentq.local.moto_server, which makes DynamoDB conditional
writes atomic as they are on AWS.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Final

LOCAL_REGION: Final = "eu-west-1"
LOCAL_CREDENTIALS: Final = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _MotoProcess:
    """One moto server process (so it never competes with the caller's GIL)."""

    def __init__(self, port: int | None, *, iam: bool) -> None:
        self.port = port or free_port()
        self.iam = iam
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        env = {**os.environ, **LOCAL_CREDENTIALS, "AWS_DEFAULT_REGION": LOCAL_REGION}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "agentq.local.moto_server", "--port", str(self.port)]
            + (["--iam"] if self.iam else []),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def wait_up(self, deadline: float, timeout_s: float) -> None:
        assert self._process is not None, "launch first"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"moto server not up on {self.url} after {timeout_s}s")

    def exited(self) -> bool:
        return self._process is None or self._process.poll() is not None

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None


class MotoServer:
    """The local AWS endpoints: `url` for every service, `dynamodb_url` for DynamoDB
    (the same URL when IAM is enforced; see the module doc)."""

    def __init__(self, port: int | None = None, *, iam: bool = False) -> None:
        self.iam = iam  # enforce IAM (agentq.local.moto_iam): only the fixed `testing` key is admin
        self._main = _MotoProcess(port, iam=iam)
        self._dynamodb = None if iam else _MotoProcess(None, iam=False)

    @property
    def port(self) -> int:
        return self._main.port

    @property
    def url(self) -> str:
        return self._main.url

    @property
    def dynamodb_url(self) -> str:
        return (self._dynamodb or self._main).url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every server's URL, the shared one first."""
        return tuple(p.url for p in self._processes())

    def exited(self, url: str) -> bool:
        """The server at `url` (one of `urls`) is not running: never started, or gone."""
        return all(p.exited() for p in self._processes() if p.url == url)

    def _processes(self) -> list[_MotoProcess]:
        return [self._main] + ([self._dynamodb] if self._dynamodb is not None else [])

    def start(self, timeout_s: float = 30.0) -> MotoServer:
        # Launched together, awaited together: the second start costs no extra wait.
        try:
            for process in self._processes():
                process.launch()
            deadline = time.monotonic() + timeout_s
            for process in self._processes():
                process.wait_up(deadline, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in self._processes():
            process.stop()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
