"""Running the console: its parts from the stage's settings, uvicorn on loopback.

`ConsoleServer` binds and listens on 127.0.0.1 on a free port (or the one asked for)
before uvicorn starts, so the URL is known and reachable at once, and serves in the foreground (`run`, for the
command) or on a thread (`start`/`stop`, for `agentq local up`, the demo and tests).
The operator's own credentials are used, through the same clients as every agentq
command; nothing is deployed and nothing listens beyond loopback.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import uvicorn

from agentq.aws import AwsClients
from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.console.actions import Actions
from agentq.console.app import ConsoleParts, create_app
from agentq.console.artifacts import TaskArtifacts
from agentq.console.deadletters import DeadLetters
from agentq.console.operations import Operations
from agentq.console.reads import ConsoleReader
from agentq.console.security import Gate
from agentq.dlq import DlqArchive, Redriver
from agentq.errors import ConfigError

START_TIMEOUT_S: Final = 15.0


@dataclass(frozen=True, kw_only=True)
class ConsoleOptions:
    port: int = 0  # 0: any free port
    allow_actions: bool = False
    refresh_ms: int = 2000
    token: str | None = None  # None: a fresh random token


def build_parts(settings: Settings, aws: AwsClients, options: ConsoleOptions) -> ConsoleParts:
    settings.require("table_name", "bus_name", "bucket", "queue_url")
    client = AgentqClient(settings=settings, sqs=aws.sqs, dynamodb=aws.dynamodb,
                          events=aws.events, s3=aws.s3)  # fmt: skip
    bucket = settings.required("bucket")
    archive = DlqArchive(aws.s3, bucket)
    redriver = Redriver(sqs=aws.sqs, queue_url=settings.required("queue_url"),
                        tasks=client.tasks, archive=archive, publisher=client.publisher)  # fmt: skip
    return ConsoleParts(
        reader=ConsoleReader(client, TaskArtifacts(aws.s3, client.results, client.outputs)),
        dead_letters=DeadLetters(aws.s3, archive),
        operations=Operations(client, aws.sqs, aws.get("cloudwatch")),
        actions=Actions(
            client,
            sts=aws.get("sts"),
            redriver=redriver,
            archive=archive,
            s3=aws.s3,
            enabled=options.allow_actions,
        ),
        gate=Gate(token=options.token, allow_actions=options.allow_actions),
        refresh_ms=options.refresh_ms,
    )


class ConsoleServer:
    def __init__(self, parts: ConsoleParts, *, port: int = 0) -> None:
        self.parts = parts
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        # Listening from here: a browser opening the printed URL before uvicorn serves
        # waits in the backlog instead of being refused.
        self._socket.listen(128)
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(create_app(parts), log_level="warning", access_log=False,
                                lifespan="off")  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, options: ConsoleOptions, *, aws: AwsClients | None = None
    ) -> ConsoleServer:
        aws = aws or AwsClients(settings.region)
        return cls(build_parts(settings, aws, options), port=options.port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The URL to open: it carries the token, which the console trades for a cookie."""
        return f"{self.base_url}/jobs?token={self.parts.gate.token}"

    def run(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM (uvicorn's own handling)."""
        self._server.run(sockets=[self._socket])

    def start(self) -> ConsoleServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]},
            name="agentq-console", daemon=True,
        )  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError("console", f"did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._socket.close()
        self.parts.reader.close()

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@contextlib.contextmanager
def serving(
    options: ConsoleOptions | None = None, *, aws: AwsClients | None = None
) -> Iterator[ConsoleServer]:
    """A console on the stage the environment names, on a thread, for the block's length
    (signing with `aws`'s credentials when given, else the environment's)."""
    server = ConsoleServer.from_settings(Settings.from_env(), options or ConsoleOptions(), aws=aws)
    with server:
        yield server
