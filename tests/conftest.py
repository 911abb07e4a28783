"""Shared fixtures: moto's server (one per session) and a freshly provisioned stage per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
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
from agentq.resources import ResourceNames

# No test may reach a real AWS account, whatever the developer's shell holds.
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_name, None)
os.environ.update({**LOCAL_CREDENTIALS, "AWS_DEFAULT_REGION": LOCAL_REGION})


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
    """The same stage in moto's in-process mock (fast; single process only)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        clients = local_session_clients(None)
        resources = provision(clients, ResourceNames(stage=_stage()))
        for key, value in resources.env().items():
            monkeypatch.setenv(key, value)
        yield Stack(resources=resources, clients=clients)
