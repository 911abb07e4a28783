"""Test helpers: bounded waiting, never sleep-and-hope."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from conftest import Stack

T = TypeVar("T")


def wait_for(
    # Literal[False] admits `lambda: (x := read()) and len(x) == n and x`, the usual shape.
    condition: Callable[[], T | Literal[False] | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> T:
    """Poll `condition` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")


class EventLog:
    """Every event the bus got, read from the save-event rule's target queue."""

    def __init__(self, stack: Stack) -> None:
        self._sqs = stack.sqs
        self._url = stack.resources.target_queues["save-event"]
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []  # the bodies as delivered, for secret scans

    def poll(self) -> list[dict[str, Any]]:
        while True:
            response = self._sqs.receive_message(
                QueueUrl=self._url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", [])
            if not messages:
                return self.events
            for message in messages:
                self.raw.append(message["Body"])
                body = json.loads(message["Body"])
                self.events.append({"detail-type": body["detail-type"], **body["detail"]})
            self._sqs.delete_message_batch(
                QueueUrl=self._url,
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
