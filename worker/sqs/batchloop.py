"""The flush loop the worker's batchers share: callers hand entries over and move on;
one background thread sends them in batches of at most `max_batch`, after a short
window for companions to arrive (at once when a batch is full or the loop is closing).

`flush()` sends what is pending at once (no window) and waits until everything handed
over before it was sent; `hurry()` ends the window and does not wait for the send;
`close()` flushes, drains what is left and stops the thread; entries handed over after
that are sent at once on the caller's thread, in batches of `max_batch` with failures
handled as in the loop, so nothing is lost at shutdown. Every wait is bounded.

Subclasses say what an entry is and how a batch is sent (`_send`), and what a batch
whose send raised leaves behind (`_failed`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

logger = logging.getLogger(__name__)
Entry = TypeVar("Entry")
# An idle loop looks at its queue this often even if nobody wakes it.
IDLE_WAKE_S: Final = 5.0


class BatchLoop(Generic[Entry]):
    def __init__(self, *, name: str, delay_s: float, max_batch: int) -> None:
        self._delay = delay_s
        self._max_batch = max_batch
        self._pending: list[Entry] = []
        # Entries queued so far and, of those, the ones whose batch is done. One thread
        # sends in order, so the done ones are always the oldest.
        self._queued = 0
        self._done = 0
        self._cond = threading.Condition()
        self._closed = False
        self._flushing = 0  # flush() calls waiting: the window is not waited out for them
        self._hurried = False  # hurry() since the last batch was taken: no window
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything handed over so far is sent; False on timeout."""
        with self._cond:
            target = self._queued
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._done >= target, timeout=timeout_s)
            finally:
                self._flushing -= 1

    def hurry(self) -> None:
        """Send what is pending now, without the window for companions; do not wait."""
        with self._cond:
            self._hurried = True
            self._cond.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def _submit(self, entries: list[Entry]) -> None:
        with self._cond:
            if not self._closed:
                self._pending.extend(entries)
                self._queued += len(entries)
                self._cond.notify_all()
                return
        # After close, send inline: nothing handed over may be lost at shutdown.
        for start in range(0, len(entries), self._max_batch):
            self._send_or_fail(entries[start : start + self._max_batch])

    def _send(self, batch: list[Entry]) -> None:
        raise NotImplementedError

    def _failed(self, batch: list[Entry]) -> None:
        """`_send` raised for `batch`: log it (subclasses also settle its entries)."""
        logger.exception("batch failed", extra={"entries": len(batch)})

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait(IDLE_WAKE_S)
                if not self._pending:
                    return  # closed, and everything handed over is sent
                first = time.monotonic()
                # Give companions a moment to arrive, unless a full batch is ready.
                while (
                    len(self._pending) < self._max_batch
                    and not self._closed
                    and not self._flushing
                    and not self._hurried
                ):
                    left = self._delay - (time.monotonic() - first)
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self._hurried = False
            try:
                self._send_or_fail(batch)
            finally:
                with self._cond:
                    self._done += len(batch)
                    self._cond.notify_all()

    def _send_or_fail(self, batch: list[Entry]) -> None:
        try:
            self._send(batch)
        except Exception:
            self._failed(batch)


def run_after(step: Callable[[], object] | None, failure: str, **extra: Any) -> None:
    """Run what follows an entry's batch; its failure is logged, never raised into the loop."""
    if step is None:
        return
    try:
        step()
    except Exception:
        logger.exception(failure, extra=extra)
