"""A worker's real parts, wired in-process against the test stage, for fault tests that
need to hold one moment (a prepared task, a beat) still."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from conftest import Stack

from agentq.config import Settings
from agentq.definitions import DefinitionRegistry
from agentq.envelope import TaskEnvelope
from agentq.events import Event
from agentq.local.workers import fast_env
from agentq.store.tasks import TaskStore
from worker.heartbeat import Heartbeat
from worker.inflight import InFlight, InFlightRegistry
from worker.settle.handler import MessageHandler
from worker.sqs.batcher import SqsBatcher

# Parts run no heartbeat unless a test beats it: where a test runs a child through the
# handler, or holds a seat while it sets up its next step, a lease of 45 s instead of
# fast_env's 3 s, or a loaded host (CI's eight test processes on two cores) outlives it:
# the fence stops the task, another message takes the lapsed seat.
LONG_LEASE: Final = {"VISIBILITY_EXTENSION_AMOUNT": "30"}


@dataclass
class RecordingSink:
    """The event batcher's contract, sending nothing: each event counts as sent."""

    events: list[Event] = field(default_factory=list)

    def publish(
        self,
        event: Event,
        /,
        *,
        then: Callable[[], object] | None = None,
        otherwise: Callable[[], object] | None = None,
    ) -> None:
        self.events.append(event)
        if then is not None:
            then()

    def publish_many(self, events: list[Event]) -> None:
        self.events.extend(events)

    def of(self, detail_type: str) -> list[Event]:
        return [e for e in self.events if e.detail_type == detail_type]


@dataclass
class Parts:
    settings: Settings
    store: TaskStore
    batcher: SqsBatcher
    inflight: InFlightRegistry
    sink: RecordingSink
    handler: MessageHandler
    heartbeat: Heartbeat


def worker_parts(
    stack: Stack,
    dynamodb: Any = None,
    worker_id: str = "w1",
    *,
    s3: Any = None,
    env: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Parts:
    """`dynamodb`, `s3`: the clients the worker's store and uploads use (faulty ones, say);
    `env`: settings over `fast_env`'s (its TASK_DEFINITIONS_DIR names the definitions);
    `environ`: what the task child's environment is drawn from (default: this process's)."""
    settings = Settings.from_env({**os.environ, **fast_env(**(env or {}))})
    store = TaskStore(dynamodb or stack.dynamodb, stack.resources.table_name)
    batcher = SqsBatcher(stack.sqs, stack.resources.queue_url, delay_s=0.0)
    inflight = InFlightRegistry()
    sink = RecordingSink()
    registry = DefinitionRegistry.from_sources(directories=settings.definitions_dirs)
    handler = MessageHandler(
        settings=settings,
        store=store,
        publisher=sink,
        batcher=batcher,
        s3=s3 or stack.s3,
        registry=registry,
        inflight=inflight,
        worker_id=worker_id,
        home_dir=Path(tempfile.mkdtemp(prefix="agentq-faults-home-")),
        environ=environ,
    )
    heartbeat = Heartbeat(
        settings=settings,
        sqs=stack.sqs,
        store=store,
        publisher=sink,  # type: ignore[arg-type]
        inflight=inflight,
        worker_id=worker_id,
    )
    return Parts(settings, store, batcher, inflight, sink, handler, heartbeat)


def send_and_receive(
    stack: Stack,
    definition: str,
    *,
    request_id: str | None = None,
    job_id: str | None = None,
    **fields: Any,
) -> tuple[TaskEnvelope, dict[str, Any], InFlight]:
    """Send a task message and take it off the queue as the consumer does; `fields` are
    the envelope's others (its input, its resume)."""
    envelope = TaskEnvelope(
        request_id=request_id or f"w-{uuid.uuid4().hex[:12]}",
        tenant="acme",
        definition=definition,
        input=fields.pop("input", {"text": "hi"}),
        job_id=job_id,
        task_key="k" if job_id else None,
        **fields,
    )
    stack.sqs.send_message(
        QueueUrl=stack.resources.queue_url,
        MessageBody=envelope.to_body(),
        MessageAttributes=envelope.message_attributes(),
    )
    [message] = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url,
        WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
        AttributeNames=["All"],
    )["Messages"]
    entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"])
    return envelope, message, entry
