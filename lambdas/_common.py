"""What every agentq Lambda shares: settings, lazily built clients, Powertools objects.

Nothing here touches AWS at import, and boto3 itself is imported with the clients:
`runtime()` builds the settings and clients on the first invocation and keeps them for
the warm container; a changed environment (tests, the local Lambda host pointed at
another stage) gets a fresh runtime. Each handler's `warm()` builds what its first
invocation builds, without calling AWS; `bench/lambda_import.py` reports import alone
and import + `warm()` ("ready"), because deferring boto3 moves its cost into the first
request rather than removing it.

The settings model (pydantic) loads with the runtime too: a handler's import does not
pay for it, and a handler that needs none of pydantic otherwise never imports it before
its first invocation (tests/unit/test_lambda_imports.py).

There is no in-process X-Ray Tracer: Powertools' Tracer imports aws_xray_sdk even when
disabled (≈250 ms of every cold start). The functions keep X-Ray active tracing
(infra/function.py), so each invocation is still traced by the Lambda service; see
docs/events-pipeline.md, "Tracing".
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aws_lambda_powertools import Logger, Metrics

from agentq.aws import AwsClients
from agentq.config.light import STAGE_VARIABLE

if TYPE_CHECKING:
    from agentq.config import Settings

METRICS_NAMESPACE: Final = "agentq"


def powertools(function: str) -> tuple[Logger, Metrics]:
    """Logger and Metrics of one function."""
    service = f"agentq-{function}"
    metrics = Metrics(namespace=METRICS_NAMESPACE, service=service)
    # A function's stage never changes (it is in its configuration), and alarms select
    # their stage's metrics by it: a dev stage must not trip prod's alarms.
    metrics.set_default_dimensions(stage=os.environ.get(STAGE_VARIABLE, "dev"))
    return Logger(service=service), metrics


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    clients: AwsClients


_lock = threading.Lock()
_cached: dict[tuple[Settings, str, str], Runtime] = {}


def warm_clients(*services: str) -> Runtime:
    """The runtime, with the named boto3 clients built (no request is sent)."""
    rt = runtime()
    for service in services:
        rt.clients.get(service)
    return rt


def runtime() -> Runtime:
    from agentq.config import Settings

    settings = Settings.from_env()
    key = (settings, os.environ.get("AWS_ENDPOINT_URL", ""),
           os.environ.get("AWS_ENDPOINT_URL_DYNAMODB", ""))  # fmt: skip
    with _lock:
        found = _cached.get(key)
        if found is None:
            found = Runtime(settings=settings, clients=AwsClients(settings.region))
            _cached.clear()  # one stage per container; do not grow across test stages
            _cached[key] = found
        return found
