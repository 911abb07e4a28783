"""Builds a worker from `Settings` and runs it: ``agentq worker`` / ``python -m worker``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentq import __version__, security
from agentq.aws import AwsClients, CallCounter
from agentq.config import Settings
from agentq.definitions import DefinitionRegistry
from agentq.errors import ConfigError
from agentq.events import now_ms
from agentq.publisher import EventPublisher
from agentq.store.tasks import TaskStore
from agentq.store.workers import RosterAnnouncer, WorkerRoster
from worker import preflight
from worker.child import isolation
from worker.child.isolation import ChildUser
from worker.child.spares import SparePool
from worker.heartbeat import HEARTBEAT_THREAD, Heartbeat
from worker.inflight import InFlightRegistry
from worker.protection import ScaleInProtection
from worker.receive.consumer import Consumer, ExitCode
from worker.secretcheck import refuse_placeholder_secrets
from worker.settle import scrub
from worker.settle.handler import MessageHandler
from worker.sqs.batcher import SqsBatcher
from worker.sqs.eventbatch import EventBatcher
from worker.telemetry import MetricsMiddleware, Middleware, make_logger


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def registry_from(settings: Settings, clients: AwsClients) -> DefinitionRegistry:
    return DefinitionRegistry.from_settings(settings, clients.dynamodb)


@dataclass
class Worker:
    """A fully wired worker; `run()` blocks until drained and returns the exit code."""

    settings: Settings
    worker_id: str
    counter: CallCounter
    consumer: Consumer
    metrics: MetricsMiddleware
    home_dir: Path
    spares: SparePool | None = None
    roster: RosterAnnouncer | None = None

    def run(self) -> ExitCode:
        if self.spares is not None:
            self.spares.start()
        if self.roster is not None:
            with contextlib.suppress(Exception):  # seen at the next tick, then
                self.roster.tick()
        try:
            return self.consumer.run()
        finally:
            if self.roster is not None:
                with contextlib.suppress(Exception):  # else "gone" after a few minutes
                    self.roster.stopped()
            if self.spares is not None:
                self.spares.close()  # no spare outlives the worker
            self.metrics.flush()
            shutil.rmtree(self.home_dir, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        """AWS calls per operation, messages received, how they were settled, beats."""
        return {
            "workerId": self.worker_id,
            "received": self.consumer.received,
            "verdicts": dict(self.consumer.verdicts),
            "heartbeats": self.consumer.heartbeats,
            "scheduler": self.consumer.tiers.stats(),
            "awsCalls": self.counter.snapshot(),
            "awsCallsTotal": self.counter.total(),
            # The heartbeat's own calls (its events go out with the rest, in `awsCalls`).
            "heartbeatCalls": self.counter.snapshot(thread=HEARTBEAT_THREAD),
        }


def build(settings: Settings, *, clients: AwsClients | None = None) -> Worker:
    settings.require("queue_url", "table_name", "bus_name", "bucket")
    counter = CallCounter()
    clients = clients or AwsClients(settings.region, counter=counter)
    if clients.counter is not None:
        counter = clients.counter
    worker_id = settings.worker_id or default_worker_id()
    store = TaskStore(clients.dynamodb, settings.required("table_name"))
    publisher = EventPublisher(
        clients.events,
        bus_name=settings.required("bus_name"),
        source=settings.app_name,
        s3_client=clients.s3,
        bucket=settings.bucket,
    )
    inflight = InFlightRegistry()
    batcher = SqsBatcher(
        clients.sqs, settings.required("queue_url"), delay_s=settings.sqs_batch_window_ms / 1000
    )
    work_root = Path(settings.work_dir or tempfile.gettempdir())
    work_root.mkdir(parents=True, exist_ok=True)
    home_dir = Path(tempfile.mkdtemp(prefix="agentq-home-", dir=work_root))
    child_user = ChildUser.resolve(settings.child_user)
    if child_user is not None:
        child_user.hand_over(home_dir)  # the CLI's HOME: it writes its state there
    busy: list[Consumer] = []  # the consumer is built last; metrics read it later

    def slots_busy() -> int:
        return busy[0].slots.busy if busy else 0

    metrics = MetricsMiddleware(
        slots_busy=slots_busy,
        counter=counter,
        stage=settings.stage,
        slots=settings.max_concurrent,
        tiers=settings.priorities,
        tenants=settings.metric_tenants,
    )
    middleware: list[Middleware] = [metrics]
    # Idle and gone workers are seen only here (agentq.store.workers): no task names them.
    roster = RosterAnnouncer(
        WorkerRoster(clients.dynamodb, settings.required("table_name")),
        worker=worker_id,
        slots=settings.max_concurrent,
        busy=slots_busy,
        version=__version__,
        clock_ms=now_ms,
    )
    ticks = [metrics.tick, roster.tick]
    if settings.ecs_agent_uri:
        protection = ScaleInProtection(
            settings.ecs_agent_uri,
            max_protected_s=settings.protection_max_ms / 1000,
            on_retire=lambda: busy[0].retire() if busy else None,
        )
        middleware.append(protection)
        ticks.append(protection.refresh)
    events = EventBatcher(publisher, delay_s=settings.event_batch_window_ms / 1000)
    handler = MessageHandler(
        settings=settings,
        store=store,
        publisher=scrub.ScrubbingSink(events),
        batcher=batcher,
        s3=clients.s3,
        registry=registry_from(settings, clients),
        inflight=inflight,
        worker_id=worker_id,
        home_dir=home_dir,
        middleware=middleware,
        child_user=child_user,
    )
    heartbeat = Heartbeat(
        settings=settings,
        sqs=clients.sqs,
        store=store,
        publisher=events,
        inflight=inflight,
        worker_id=worker_id,
        routes=batcher.routes,
    )
    consumer = Consumer(
        settings=settings,
        sqs=clients.sqs,
        handler=handler,
        heartbeat=heartbeat,
        batcher=batcher,
        events=events,
        inflight=inflight,
        on_tick=ticks,
    )
    busy.append(consumer)
    return Worker(
        settings=settings,
        worker_id=worker_id,
        counter=counter,
        consumer=consumer,
        metrics=metrics,
        home_dir=home_dir,
        spares=handler.spares,
        roster=roster,
    )


def main() -> int:
    # First: from here on the worker's memory and environment (the task role's credentials
    # endpoint) are closed to its task children, whichever user they run as.
    isolation.forbid_inspection()
    security.remember_environment(os.environ)
    try:
        settings = Settings.from_env()
        refuse_placeholder_secrets()
        logger = make_logger(settings.log_level)
        scrub.scrub_log_handlers(logger.handlers)
        settings.require("queue_url", "table_name", "bus_name", "bucket")
        clients = AwsClients(settings.region, counter=CallCounter())
        preflight.check(settings, clients)
        worker = build(settings, clients=clients)
    except ConfigError as exc:
        sys.stderr.write(f"agentq worker: {exc}\n")
        return ExitCode.CONFIG
    code = worker.run()
    stats = worker.stats()
    logger.info("worker stopped", extra={"exitCode": int(code), "stats": stats})
    # One plain line for scripts and the benchmark (calls per task).
    sys.stdout.write("AGENTQ_WORKER_STATS " + json.dumps(stats, sort_keys=True) + "\n")
    sys.stdout.flush()
    return int(code)
