"""Messages a worker holds: one entry per received message until it is settled.

Each entry knows how much longer SQS lets its message stay invisible: a visibility may
end at most 12 hours after the receive that returned the receipt handle held (AWS
rejects a ChangeMessageVisibility past that). Every visibility the worker sets for a
held message (heartbeat, back-off, retry) is kept within `visibility_room_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.envelope import TaskEnvelope
from agentq.store.tasks import Lease
from worker.child.supervisor import StopSignal

# SQS: a message's visibility ends at most this long after the receive that returned it.
MAX_VISIBILITY_S: Final = 43_200
# Kept short of that: our stamp of a receive is a little later than SQS's (the response's
# way back, the other messages of its batch), and a change waits in the batcher's window
# and botocore's retries before SQS applies it.
VISIBILITY_MARGIN_S: Final = 300


@dataclass
class InFlight:
    message_id: str
    receipt_handle: str
    # As received (body and attributes): what a give-back requeues as a fresh copy.
    message: Mapping[str, Any] | None = None
    received_at: float = field(default_factory=time.monotonic)
    # When the receive that returned `receipt_handle` was seen (monotonic): a newer
    # receive of the same message (`InFlightRegistry.add`) starts SQS's 12 hours again.
    handle_received_at: float = field(default_factory=time.monotonic)
    tier: str | None = None  # the priority tier whose queue it came from
    # Received on its tier's starvation turn (weighted mode): the next slot is its.
    starving: bool = False
    envelope: TaskEnvelope | None = None
    lease: Lease | None = None
    child_pid: int | None = None
    stop: StopSignal = field(default_factory=StopSignal)
    # Visibility extension gives up after consecutive failures (the seed's rule).
    extension_failures: int = 0
    extending: bool = True
    # Settled, its delete not yet sent: the registry (and so the heartbeat) keeps it
    # after its slot is done, until the delete batch removes it.
    awaiting_delete: bool = False

    @property
    def request_id(self) -> str | None:
        return self.envelope.request_id if self.envelope else None

    def visibility_room_s(self, now: float | None = None) -> float:
        """The longest visibility (s) SQS still accepts for the held receipt handle: 12
        hours from its receive, less the time since and VISIBILITY_MARGIN_S (0 at the end)."""
        elapsed = (time.monotonic() if now is None else now) - self.handle_received_at
        return max(0.0, MAX_VISIBILITY_S - VISIBILITY_MARGIN_S - elapsed)

    def within_visibility_room(self, seconds: float) -> float:
        """`seconds`, or less if SQS would reject that long a visibility for this receive."""
        return min(seconds, self.visibility_room_s())


class InFlightRegistry:
    """Thread-safe set of held messages; the heartbeat extends exactly these."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, InFlight] = {}

    def add(self, entry: InFlight) -> InFlight | None:
        """Register a received message; returns the entry already holding it, if any.

        A worker can receive a message it already runs when its visibility lapsed (a
        slow heartbeat). The newest receipt handle is the one SQS honours for deletes.
        """
        with self._lock:
            held = self._entries.get(entry.message_id)
            if held is not None:
                held.receipt_handle = entry.receipt_handle
                held.handle_received_at = entry.handle_received_at
                held.extension_failures = 0
                held.extending = True
                return held
            self._entries[entry.message_id] = entry
            return None

    def holds(self, entry: InFlight) -> bool:
        with self._lock:
            return self._entries.get(entry.message_id) is entry

    def remove(self, entry: InFlight) -> None:
        with self._lock:
            if self._entries.get(entry.message_id) is entry:
                del self._entries[entry.message_id]

    def snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
