"""Helpers for fault tests: clients of the test stage with a given fault spec installed."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import boto3
from conftest import Stack

from agentq.aws import make_client
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION


def rule(op: str, kind: Kind, rate: float = 1.0, **extra: Any) -> FaultRule:
    return FaultRule(op=op, kind=kind, rate=rate, **extra)


def injector(*rules: FaultRule, seed: int = 7) -> FaultInjector:
    return FaultInjector(FaultSpec(rules=rules), seed=seed)


class Attempts:
    """HTTP attempts per operation (retries included): botocore asks `needs-retry` once
    after every attempt, whether it got an answer or a connection error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def attach(self, client: Any) -> Any:
        client.meta.events.register("needs-retry", self._count)
        return client

    def _count(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.counts[event_name.rsplit(".", 1)[-1]] += 1


def faulty_client(stack: Stack, service: str, faults: FaultInjector) -> Any:
    """A client built the way agentq builds them, with `faults` installed."""
    session = boto3.session.Session(
        region_name=LOCAL_REGION,
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    client = make_client(session, service, endpoint_url=stack.resources.endpoint_url)
    return install(client, faults)


def drain_bodies(stack: Stack, queue_url: str) -> list[dict[str, Any]]:
    """Every message now visible on a queue, deleted as read (bodies parsed as JSON)."""
    import json

    seen: list[dict[str, Any]] = []
    while messages := stack.sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
    ).get("Messages", []):
        seen.extend(json.loads(m["Body"]) for m in messages)
        stack.sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
    return seen


def unique_seed() -> str:
    """A seed of its own per test: the process keeps one injector per environment, and
    a rule's `limit` must not be spent by an earlier test with the same spec."""
    import uuid

    return str(uuid.uuid4().int % 2**31)
