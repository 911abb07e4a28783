"""Shared fixtures: moto's server (one per session, per xdist worker) and a freshly
provisioned stage per test; and each test's kind as a marker (unit, stack, process, e2e)."""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import botocore.endpoint
import pytest
from hypothesis import HealthCheck, settings
from moto import mock_aws

from agentq.aws import AwsClients
from agentq.local.aws import (
    LOCAL_CREDENTIALS,
    LOCAL_REGION,
    LocalResources,
    MotoServer,
    local_session_clients,
    provision,
    provision_on,
)
from agentq.local.launcher import FORKING
from agentq.resources import ResourceNames

# Property tests judge what they generate, not how fast: the suite runs on several
# processes on a loaded machine, where input generation can take seconds. A test that
# sets its own `settings` keeps them over this profile's.
settings.register_profile(
    "agentq",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("agentq")

# No test may reach a real AWS account, whatever the developer's shell holds.
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_name, None)
os.environ.update({**LOCAL_CREDENTIALS, "AWS_DEFAULT_REGION": LOCAL_REGION})

# The suite starts ~170 workers: each forks from one
# process per test process that has imported their libraries (agentq.local.launcher),
# not a fresh interpreter. The isolation tests start their workers afresh, as another
# user (tests/security/security_support.py).
FORKING.enabled = True


# What a test needs to run, slowest first: `make test-fast` runs unit and stack tests.
KINDS = {
    "e2e": "the whole system: the local stack, the demo, the tutorial, a benchmark run",
    "process": "starts real processes (workers, children, the CLI, Chromium, tmux)",
    "stack": "a provisioned stage on moto (in process or its server), no process of its own",
    "unit": "none of the above",
}
_E2E_DIRS = ("integration", "bench")
# Names a test module uses when it starts processes (its own or through a helper).
_STARTS_PROCESSES = re.compile(
    r"\b(subprocess|Popen|WorkerProcess|running_worker|worker_parts_process|playwright|"
    r"chromium|tmux|os\.fork|multiprocessing|run_cli|agentq_cli|agentq_process|spawn|"
    r"process=True)\b"
)
_STACK_FIXTURES = {"stack", "inproc_stack", "moto_server"}


def pytest_configure(config: pytest.Config) -> None:
    for kind, meaning in KINDS.items():
        config.addinivalue_line("markers", f"{kind}: {meaning}")


@functools.cache
def _starts_processes(path: str) -> bool:
    with open(path, encoding="utf-8") as source:
        return bool(_STARTS_PROCESSES.search(source.read()))


def _kind(item: pytest.Item) -> str:
    if item.get_closest_marker("e2e") or item.path.parent.name in _E2E_DIRS:
        return "e2e"
    if item.get_closest_marker("process") or _starts_processes(str(item.path)):
        return "process"
    if _STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "stack"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = _kind(item)
        if not item.get_closest_marker(kind):
            item.add_marker(kind)


@dataclass
class Stack:
    """A provisioned stage: resource names/URLs plus clients pointed at it."""

    resources: LocalResources
    clients: dict[str, Any]

    @property
    def sqs(self) -> Any:
        return self.clients["sqs"]

    @property
    def dynamodb(self) -> Any:
        return self.clients["dynamodb"]

    @property
    def events(self) -> Any:
        return self.clients["events"]

    @property
    def s3(self) -> Any:
        return self.clients["s3"]

    def env(self) -> dict[str, str]:
        return self.resources.env()

    def aws_clients(self) -> AwsClients:
        return AwsClients(LOCAL_REGION)


@pytest.fixture(scope="module", autouse=True)
def _environment_per_module() -> Iterator[None]:
    """Each module leaves the process environment as it found it. A test process runs
    many modules: one whose stack failed to stop, or that ran a command in-process
    with `--local-env`, must not have the next module sign with that stack's keys and
    enforce its IAM (seen: a whole test process's later modules denied)."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(autouse=True)
def botocore_backoff(request: pytest.FixtureRequest) -> Iterator[list[float]]:
    """In tests/faults, botocore's retry backoff on a controllable clock: the waits it
    asks for are recorded (in order), not slept. A fault that outlasts botocore's retries
    (standard mode: five attempts) made a test wait out up to 15 s of jittered backoff a
    call for nothing it asserts: the attempts, their order and the final error are the
    same without the waits. Processes the tests start keep the real backoff."""
    waits: list[float] = []
    if "faults" not in request.node.path.parts:
        yield waits
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(botocore.endpoint, "time", SimpleNamespace(sleep=waits.append))
        yield waits


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def _stage() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def stack(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """A fresh stage on moto's server; the environment points boto3 and Settings at it."""
    clients, resources = provision_on(moto_server, ResourceNames(stage=_stage()))
    for key, value in resources.env().items():
        monkeypatch.setenv(key, value)
    return Stack(resources=resources, clients=clients)


@pytest.fixture
def inproc_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The same stage in moto's in-process mock (fast; single process only), patched as
    the local moto server is (agentq.local.moto_server: the same answers, a third less
    CPU for the tests that read many items) and put back afterwards."""
    from moto_support import patch_as_the_local_server

    patch_as_the_local_server(monkeypatch)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        clients = local_session_clients(None)
        resources = provision(clients, ResourceNames(stage=_stage()))
        for key, value in resources.env().items():
            monkeypatch.setenv(key, value)
        yield Stack(resources=resources, clients=clients)
