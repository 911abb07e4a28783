"""What every agentq Lambda shares: settings, lazily built clients, Powertools objects.

Nothing here touches AWS at import. `runtime()` builds the settings and clients on the
first invocation and keeps them for the warm container; a changed environment (tests,
the local Lambda host pointed at another stage) gets a fresh runtime.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Final

from aws_lambda_powertools import Logger, Metrics, Tracer

from agentq.aws import AwsClients
from agentq.config import Settings

METRICS_NAMESPACE: Final = "agentq"


def powertools(function: str) -> tuple[Logger, Metrics, Tracer]:
    """Logger, Metrics and Tracer of one function.

    Tracer disables itself outside Lambda (no X-Ray daemon locally); the local host also
    sets POWERTOOLS_TRACE_DISABLED.
    """
    service = f"agentq-{function}"
    return (
        Logger(service=service),
        Metrics(namespace=METRICS_NAMESPACE, service=service),
        Tracer(service=service),
    )


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    clients: AwsClients


_lock = threading.Lock()
_cached: dict[tuple[Settings, str], Runtime] = {}


def runtime() -> Runtime:
    settings = Settings.from_env()
    key = (settings, os.environ.get("AWS_ENDPOINT_URL", ""))
    with _lock:
        found = _cached.get(key)
        if found is None:
            found = Runtime(settings=settings, clients=AwsClients(settings.region))
            _cached.clear()  # one stage per container; do not grow across test stages
            _cached[key] = found
        return found
