"""The local stack every benchmark runs against: moto's server on loopback, a freshly
provisioned stage per benchmark, real worker processes, and helpers to feed and read it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.envelope import TaskEnvelope
from agentq.local.aws import LocalResources, MotoServer, provision_on
from agentq.local.workers import REPO_ROOT, SAMPLE_DEFINITIONS, WorkerProcess, fast_env
from agentq.resources import ResourceNames

BENCH_DEFINITIONS: Final = Path(__file__).resolve().parent / "definitions"
TENANT: Final = "bench"


@dataclass
class Stage:
    """One provisioned stage and clients pointed at it."""

    resources: LocalResources
    clients: dict[str, Any]

    @property
    def sqs(self) -> Any:
        return self.clients["sqs"]

    @property
    def queue_url(self) -> str:
        return self.resources.queue_url

    def env(self) -> dict[str, str]:
        return self.resources.env()

    def set_visibility_timeout(self, seconds: int) -> None:
        self.sqs.set_queue_attributes(
            QueueUrl=self.queue_url, Attributes={"VisibilityTimeout": str(seconds)}
        )

    def tap(self, *detail_types: str) -> str:
        """A queue that gets the stage's events of `detail_types` from now on, through a
        rule of its own (the save-event rule leaves heartbeats out)."""
        names = self.resources.names
        name = f"{names.prefix}-tap"
        url: str = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        pattern = {"source": [names.app_name], "detail-type": list(detail_types)}
        events = self.clients["events"]
        events.put_rule(Name=name, EventBusName=names.event_bus, EventPattern=json.dumps(pattern))
        events.put_targets(Rule=name, EventBusName=names.event_bus,
                           Targets=[{"Id": "tap", "Arn": arn["Attributes"]["QueueArn"]}])  # fmt: skip
        return url

    def queue_counts(self, url: str | None = None) -> tuple[int, int]:
        """(visible, in flight) messages of the task queue (or another queue)."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )

    def send(self, envelopes: Sequence[TaskEnvelope]) -> None:
        """Send as a producer would, ten per SendMessageBatch."""
        for start in range(0, len(envelopes), 10):
            chunk = envelopes[start : start + 10]
            response = self.sqs.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(n), "MessageBody": e.to_body(),
                     "MessageAttributes": e.message_attributes()}
                    for n, e in enumerate(chunk)
                ],
            )  # fmt: skip
            if response.get("Failed"):
                raise RuntimeError(f"send failed: {response['Failed']}")

    def send_raw(self, body: str, attributes: Mapping[str, str] | None = None) -> None:
        self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body,
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v} for k, v in (attributes or {}).items()
            },
        )

    def wait_drained(
        self, timeout_s: float, url: str | None = None, *, poll_s: float = 0.05
    ) -> float:
        """Wait until the queue holds nothing (visible, in flight or delayed); returns when.

        Delayed counts too: a worker's backed-off fresh copy is delayed, and one that
        turns visible after the workers stopped would be left behind.
        Each poll costs moto a walk over every message in the queue: a benchmark that
        times the workers rather than the drain polls slowly (or waits on its side log).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.queue_held(url) == 0:
                return time.time()
            time.sleep(poll_s)
        raise TimeoutError(f"queue not drained after {timeout_s}s: {self.queue_counts(url)}")

    def queue_held(self, url: str | None = None) -> int:
        """Messages the queue holds: visible, in flight and delayed."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(attributes.get(name, 0)) for name in attributes)


@contextmanager
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def new_stage(server: MotoServer, *, prefix: str = "b") -> Stage:
    clients, resources = provision_on(server, ResourceNames(stage=prefix + uuid.uuid4().hex[:9]))
    return Stage(resources=resources, clients=clients)


def worker_env(stage: Stage, **overrides: str) -> dict[str, str]:
    """Short test intervals, the bench and sample definitions, bench.tasks importable."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {
        **stage.env(),
        **fast_env(),
        "TASK_DEFINITIONS_DIR": os.pathsep.join([str(BENCH_DEFINITIONS), str(SAMPLE_DEFINITIONS)]),
        "PYTHONPATH": pythonpath,
        "LOG_LEVEL": "INFO",
        # A SIGKILLed worker must not take its last log lines with it.
        "PYTHONUNBUFFERED": "1",
    }
    env.update(overrides)
    return env


def envelope(definition: str, payload: Mapping[str, Any], *, request_id: str = "") -> TaskEnvelope:
    return TaskEnvelope(
        request_id=request_id or f"b-{uuid.uuid4().hex[:16]}",
        tenant=TENANT,
        definition=definition,
        input=dict(payload),
    )


@contextmanager
def workers(
    count: int, env: Mapping[str, str], *, log_dir: Path, name: str = "w"
) -> Iterator[list[WorkerProcess]]:
    """`count` worker processes; whatever is still alive at exit is killed."""
    fleet = [WorkerProcess(f"{name}{i}", log_dir=log_dir) for i in range(count)]
    try:
        for worker in fleet:
            worker.start(env)
        yield fleet
    finally:
        for worker in fleet:
            if worker.alive():
                worker.kill()


def wait_started(fleet: Iterable[WorkerProcess], timeout_s: float = 60.0) -> None:
    for worker in fleet:
        worker.wait_for_output("worker started", timeout=timeout_s)


def stop_all(fleet: Iterable[WorkerProcess], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """SIGTERM every worker (drain in parallel) and collect their exit stats lines."""
    fleet = list(fleet)
    for worker in fleet:
        worker.send(signal.SIGTERM)  # once: a second SIGTERM means "exit now, no stats"
    stats = []
    for worker in fleet:
        try:
            worker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            worker.kill()
        found = worker.stats()
        if found is not None:
            stats.append(found)
    return stats


def merge_calls(stats: Iterable[Mapping[str, Any]], key: str = "awsCalls") -> dict[str, int]:
    """The workers' call counts summed (`key`: "awsCalls", or "heartbeatCalls")."""
    total: dict[str, int] = {}
    for entry in stats:
        for op, n in entry.get(key, {}).items():
            total[op] = total.get(op, 0) + int(n)
    return dict(sorted(total.items()))


def read_side_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    # A task may be appending its line while this reads (a read can see part of a
    # write): a last line without its newline is not whole yet, the next read has it.
    records = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


def wait_side_log_ends(path: Path, count: int, timeout_s: float) -> None:
    """Wait until `count` tasks have logged an ok end: a file read, no AWS call."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = {r["requestId"] for r in read_side_log(path)
                 if r["event"] == "end" and r.get("outcome") == "ok"}  # fmt: skip
        if len(ended) >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"side log {path}: fewer than {count} tasks ended ok after {timeout_s}s")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return float(cuts[max(0, min(98, round(q) - 1))])


def timed_calls(call: Any, repeat: int) -> float:
    """Median seconds of `repeat` calls of `call()`."""
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)
