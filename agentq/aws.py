"""boto3 clients for agentq, with botocore's standard retry mode and per-call counting.

Clients are built by `AwsClients` on first use, never at import. Endpoints follow
boto3's own `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_<SERVICE>` variables, which is how
the local stack points everything at moto.

boto3 itself is imported when the first `AwsClients` (or `client_config`) is built, not
with this module: a Lambda handler imports it at load and builds its clients on the
first invocation, and boto3's import (≈150 ms) belongs with the clients.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from botocore.config import Config


class CallCounter:
    """Counts AWS API calls per (service, operation), in all and per calling thread (so a
    worker can tell its heartbeat's share); safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()  # (thread, service, op)

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-call", self._count)
        return client

    def _count(self, model: Any, **_: Any) -> None:
        key = (threading.current_thread().name, model.service_model.service_name, model.name)
        with self._lock:
            self._counts[key] += 1

    def snapshot(self, *, thread: str | None = None) -> dict[str, int]:
        """`service:Operation` -> calls, of every thread or of the threads named `thread`."""
        totals: Counter[str] = Counter()
        with self._lock:
            for (name, service, op), n in self._counts.items():
                if thread is None or name == thread:
                    totals[f"{service}:{op}"] += n
        return dict(sorted(totals.items()))

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


def client_config(
    *,
    max_pool_connections: int = 20,
    connect_timeout: float = 5,
    read_timeout: float = 40,
    max_attempts: int = 5,
) -> Config:
    from botocore.config import Config

    # Long polls hold a connection for up to 20 s; the read timeout must exceed that.
    return Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )


@functools.cache
def _models() -> Any:
    from botocore.loaders import create_loader

    return create_loader()


def new_session(
    region: str, *, access_key_id: str | None = None, secret_access_key: str | None = None
) -> Any:
    """A boto3 session whose service models come from one loader per process. Each new
    session would otherwise read and parse the same model files again: about 0.4 s for
    four clients, against 0.04 s with the loader shared (its caches are read-only data,
    as the default session shares them between all of its clients)."""
    import boto3

    session = boto3.session.Session(region_name=region, aws_access_key_id=access_key_id,
                                    aws_secret_access_key=secret_access_key)  # fmt: skip
    session._session.register_component("data_loader", _models())
    return session


def make_client(
    session: Any,
    service: str,
    *,
    endpoint_url: str | None = None,
    counter: CallCounter | None = None,
    config_options: Mapping[str, Any] | None = None,
) -> Any:
    """The one place agentq builds a boto3 client: standard retries, counting, and the
    environment's fault injection (AGENTQ_FAULTS, off unless set; docs/faults.md)."""
    from agentq.faults import install_from_env

    client = session.client(
        service, endpoint_url=endpoint_url, config=client_config(**(config_options or {}))
    )
    if counter is not None:
        counter.attach(client)
    return install_from_env(client)


class AwsClients:
    """Lazily created, shared clients of one process (boto3 clients are thread-safe)."""

    def __init__(
        self,
        region: str,
        *,
        counter: CallCounter | None = None,
        config_options: Mapping[str, Any] | None = None,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        """`credentials`: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` to sign with instead
        of the environment's (the IAM-enforced local stack's operator)."""
        self.region = region
        self.counter = counter
        # A command line wants to give up sooner than a worker (see agentq.cli.common).
        self._config_options = dict(config_options or {})
        keys = credentials or {}
        self._session = new_session(region, access_key_id=keys.get("AWS_ACCESS_KEY_ID"),
                                    secret_access_key=keys.get("AWS_SECRET_ACCESS_KEY"))  # fmt: skip
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = make_client(
                    self._session, service, counter=self.counter,
                    config_options=self._config_options,
                )  # fmt: skip
            return self._clients[service]

    @property
    def sqs(self) -> Any:
        return self.get("sqs")

    @property
    def dynamodb(self) -> Any:
        return self.get("dynamodb")

    @property
    def events(self) -> Any:
        return self.get("events")

    @property
    def s3(self) -> Any:
        return self.get("s3")
