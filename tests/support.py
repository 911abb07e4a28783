"""Test helpers: bounded waiting, never sleep-and-hope."""

from __future__ import annotations

import contextlib
import importlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from conftest import Stack

from agentq.local.workers import poll_pause
from agentq.resources import SAVE_EVENT_SKIPPED_TYPES

T = TypeVar("T")


def wait_for(
    # Literal[False] admits `lambda: (x := read()) and len(x) == n and x`, the usual shape.
    condition: Callable[[], T | Literal[False] | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> T:
    """Poll `condition` until it returns a truthy value; fail after `timeout` seconds.

    The pause between polls starts at `interval` and grows to a tenth of the time waited
    so far (at most a second): most conditions read the local stack, and a long wait
    polled every 50 ms spends the CPU that eight test processes on two cores share. A
    condition still false at the deadline is asked once more.
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        last = condition()
        if last:
            return last
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(poll_pause(now - start, interval), deadline - now))
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")


def logged_ms(record: dict[str, Any]) -> int:
    """When a worker's log record was written (its `timestamp`, this host's clock), in ms."""
    return int(datetime.strptime(record["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z").timestamp() * 1000)


def settle_indexes(stack: Stack) -> None:
    """Wait until the events table's indexes show every write made before this call.

    The local server's indexes lag the table (agentq.local.rules.dynamodb_index_lag) by
    a fixed delay, so once a marker written now shows in an index, every earlier write
    shows in all of them: a test that reads an index right after writing waits on that
    condition instead of assuming DynamoDB's read-after-write, which indexes lack."""
    marker = f"SETTLE#{time.monotonic_ns()}#{threading.get_ident()}"
    ddb, table = stack.dynamodb, stack.resources.table_name
    ddb.put_item(TableName=table, Item={"PK": {"S": marker}, "SK": {"S": "SETTLE"},
                                        "typePK": {"S": marker}, "typeSK": {"S": "0"}})  # fmt: skip

    def indexed() -> bool:
        found = ddb.query(TableName=table, IndexName="byType",
                          KeyConditionExpression="typePK = :pk",
                          ExpressionAttributeValues={":pk": {"S": marker}})  # fmt: skip
        return bool(found.get("Items"))

    wait_for(indexed, timeout=60, interval=0.02, message="the indexes to catch up")
    ddb.delete_item(TableName=table, Key={"PK": {"S": marker}, "SK": {"S": "SETTLE"}})


class EventLog:
    """Every event the bus got that the save-event rule routes, read from its target
    queue. With `skipped_types`, also the types that rule leaves out (heartbeats,
    requests), through a rule of the log's own on the stage's bus (from then on)."""

    def __init__(self, stack: Stack, *, skipped_types: bool = False) -> None:
        self._sqs = stack.sqs
        self._urls = [stack.resources.target_queues["save-event"]]
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []  # the bodies as delivered, for secret scans
        if skipped_types:
            self._urls.append(_tap(stack, SAVE_EVENT_SKIPPED_TYPES))

    def poll(self) -> list[dict[str, Any]]:
        for url in self._urls:
            self._drain(url)
        return self.events

    def _drain(self, url: str) -> None:
        while True:
            response = self._sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", [])
            if not messages:
                return
            for message in messages:
                self.raw.append(message["Body"])
                body = json.loads(message["Body"])
                self.events.append({"detail-type": body["detail-type"], **body["detail"]})
            self._sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )

    def of(self, request_id: str, detail_type: str | None = None) -> list[dict[str, Any]]:
        self.poll()
        return [
            e
            for e in self.events
            if e.get("requestId") == request_id
            and (detail_type is None or e["detail-type"] == detail_type)
        ]

    def types(self, request_id: str) -> list[str]:
        return [e["detail-type"] for e in self.of(request_id)]

    def wait(
        self, request_id: str, detail_type: str, *, count: int = 1, timeout: float = 90.0
    ) -> list[dict[str, Any]]:
        return wait_for(
            lambda: (found := self.of(request_id, detail_type)) and len(found) >= count and found,
            timeout=timeout,
            interval=0.1,
            message=f"{count}x {detail_type} for {request_id}",
        )


def _tap(stack: Stack, detail_types: tuple[str, ...]) -> str:
    """A queue that gets the stage's events of `detail_types` from now on (its own rule)."""
    names = stack.resources.names
    name = f"{names.prefix}-tap"
    url: str = stack.sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    pattern = {"source": [names.app_name], "detail-type": list(detail_types)}
    stack.events.put_rule(Name=name, EventBusName=names.event_bus,
                          EventPattern=json.dumps(pattern))  # fmt: skip
    stack.events.put_targets(Rule=name, EventBusName=names.event_bus,
                             Targets=[{"Id": "tap", "Arn": arn["Attributes"]["QueueArn"]}])  # fmt: skip
    return url


class Forwarder:
    """A TCP forwarder to moto's server: a real network in between, slowed or cut.

    Held (`hold` until `release`), every request waits before it reaches moto: a slow
    service. Cut (`cut` until `mend`), every open connection and every new one closes at
    once, so the client sees its requests fail, as when the service is unreachable.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._passing = threading.Event()
        self._passing.set()
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                if self._cut.is_set():
                    client.close()
                    continue
                self.connections += 1
                upstream = socket.create_connection(self._target)
                with self._lock:
                    self._open += [client, upstream]
                # Only requests are held; answers to requests already let through flow.
                for source, sink, held in ((client, upstream, True), (upstream, client, False)):
                    threading.Thread(target=self._pump, args=(source, sink, held),
                                     daemon=True).start()  # fmt: skip

    def _pump(self, source: socket.socket, sink: socket.socket, held: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if held:
                    self._passing.wait()
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        self._passing.clear()

    def release(self) -> None:
        self._passing.set()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def mend(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.release()
        self.cut()
        self._listener.close()


@contextlib.contextmanager
def forwarder(stack: Stack, service: str) -> Iterator[Forwarder]:
    """A Forwarder to the moto server of the stack's `service`, closed on the way out."""
    endpoint = urlsplit(stack.resources.endpoint_for(service) or "")
    proxy = Forwarder((endpoint.hostname or "127.0.0.1", endpoint.port or 80))
    try:
        yield proxy
    finally:
        proxy.close()


def store_events(stack: Stack) -> list[dict[str, Any]]:
    """Play the save-event Lambda: store every event that reached the bus; returns those
    stored now (a copy already stored is not returned), each as its detail and type."""
    from agentq.events import Event
    from agentq.store import EventStore

    store = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    stored: list[dict[str, Any]] = []
    url = stack.resources.target_queues["save-event"]
    while messages := stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get(
        "Messages", []
    ):
        for message in messages:
            body = json.loads(message["Body"])
            if store.append(Event.from_detail(body["detail"], body["detail-type"])):
                stored.append({"detail-type": body["detail-type"], **body["detail"]})
            stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return stored


class LazyModule:
    """A module imported when one of its public names is first read: a test module that
    every test process collects takes a heavy library this way when only the process
    running its tests needs it. Private names are not passed on: collection looks for
    pytest's own (a fixture's marker) on everything a test module holds."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)
