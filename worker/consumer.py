"""The worker process: a receiver, N slots, one heartbeat, and a graceful drain.

The receiver long-polls for exactly as many messages as there are free slots, so no
message sits invisible in a worker that cannot start it; a slot is refilled as soon as
it frees. Each slot settles one message at a time (worker.handler). One heartbeat keeps
every held message invisible and every lease alive.

Shutdown (first SIGTERM/SIGINT): stop receiving; running tasks keep their heartbeats
until DRAIN_TIMEOUT; then they are stopped and released (visibility 0, attempt given
back). A second signal exits at once. Exit codes: see `ExitCode`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import IntEnum
from types import FrameType
from typing import Any, Final

from agentq.config import Settings
from worker.batcher import SqsBatcher
from worker.eventbatch import EventBatcher
from worker.handler import MessageHandler
from worker.heartbeat import Heartbeat
from worker.inflight import InFlightRegistry

logger = logging.getLogger(__name__)
RECEIVE_ERROR_BACKOFF_S: Final = 1.0


class ExitCode(IntEnum):
    OK = 0  # drained: every running task finished
    ERROR = 1  # fatal error at start-up or in the main loop
    DRAIN_TIMEOUT = 3  # DRAIN_TIMEOUT passed: unfinished tasks were stopped and released
    FORCED = 4  # a second signal: children killed, exit without draining
    CONFIG = 5  # configuration error (same code as the CLI)


class Slots:
    """Free-slot accounting; the receiver asks for exactly the free count."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._busy = 0
        self._cond = threading.Condition()

    @property
    def busy(self) -> int:
        with self._cond:
            return self._busy

    def wait_free(self, timeout_s: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._busy < self.size, timeout=timeout_s)
            return self.size - self._busy

    def take(self) -> None:
        with self._cond:
            self._busy += 1

    def give(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout=timeout_s)


class Consumer:
    def __init__(
        self,
        *,
        settings: Settings,
        sqs: Any,
        handler: MessageHandler,
        heartbeat: Heartbeat,
        batcher: SqsBatcher,
        events: EventBatcher,
        inflight: InFlightRegistry,
        on_tick: Sequence[Any] = (),
    ) -> None:
        self._settings = settings
        self._sqs = sqs
        self._queue_url = settings.required("queue_url")
        self._handler = handler
        self._heartbeat = heartbeat
        self._batcher = batcher
        self._events = events
        self._inflight = inflight
        self._on_tick = list(on_tick)
        self.slots = Slots(settings.max_concurrent)
        self._pool = ThreadPoolExecutor(settings.max_concurrent, thread_name_prefix="slot")
        self._stopping = threading.Event()
        self._signals = 0
        self._signalled = threading.Event()
        self._receiver = threading.Thread(target=self._receive_loop, name="receiver", daemon=True)
        self.received = 0
        self.verdicts: dict[str, int] = {}
        self._verdict_lock = threading.Lock()

    # -- running -----------------------------------------------------------------------
    def run(self) -> ExitCode:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._heartbeat.start()
        self._receiver.start()
        logger.info("worker started", extra={"slots": self.slots.size})
        while not self._signalled.wait(1.0):
            for tick in self._on_tick:
                with contextlib.suppress(Exception):
                    tick()
        return self.drain()

    def stop(self) -> None:
        """Begin a graceful drain (as a first SIGTERM does)."""
        self._stopping.set()
        self._signalled.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            self._force_exit()
        logger.info("shutdown requested; draining", extra={"signal": signum})
        self.stop()

    def _force_exit(self) -> None:
        for entry in self._inflight.snapshot():
            if entry.child_pid:
                with contextlib.suppress(OSError):
                    os.killpg(entry.child_pid, signal.SIGKILL)
        if self._handler.spares is not None:
            self._handler.spares.kill()
        logger.warning("second signal: exiting without draining")
        os._exit(ExitCode.FORCED)

    def drain(self) -> ExitCode:
        self._stopping.set()
        deadline = time.monotonic() + self._settings.drain_timeout_ms / 1000
        # First let the receiver leave its long poll (whatever it brings back is
        # released), so no message starts once draining has begun.
        self._receiver.join(timeout=self._settings.wait_time_seconds + 10)
        code = ExitCode.OK
        if not self.slots.wait_idle(max(0.0, deadline - time.monotonic())):
            code = ExitCode.DRAIN_TIMEOUT
            running = self._inflight.snapshot()
            logger.warning("drain timed out; stopping running tasks", extra={"tasks": len(running)})
            for entry in running:
                entry.stop.set("shutdown")
            self.slots.wait_idle(self._settings.kill_grace_ms / 1000 + 30)
        self._pool.shutdown(wait=True)
        self._heartbeat.stop()
        self._events.close()
        self._batcher.close()
        return code

    # -- receiving -----------------------------------------------------------------------
    def _receive_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                free = self.slots.wait_free(timeout_s=0.5)
                if free <= 0 or self._stopping.is_set():
                    continue
                messages = self._receive(min(free, 10))
                for message in messages:
                    if self._stopping.is_set():
                        self._batcher.change_visibility(message["ReceiptHandle"], 0)
                        continue
                    self.received += 1
                    self.slots.take()
                    self._pool.submit(self._slot, message)
            except Exception:
                logger.exception("receive failed; retrying")
                self._stopping.wait(RECEIVE_ERROR_BACKOFF_S)

    def _receive(self, count: int) -> list[dict[str, Any]]:
        response = self._sqs.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=count,
            WaitTimeSeconds=self._settings.wait_time_seconds,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
        )
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    def _slot(self, message: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            verdict = self._handler.handle(message)
        except Exception:
            # One broken message must not take the slot (or the worker) down; SQS will
            # redeliver it after its visibility timeout and the STATE item arbitrates.
            logger.exception(
                "message handling failed", extra={"messageId": message.get("MessageId")}
            )
            verdict = "error"
        finally:
            self.slots.give()
        with self._verdict_lock:
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        logger.info(
            "message settled",
            extra={"messageId": message.get("MessageId"), "verdict": verdict,
                   "seconds": round(time.monotonic() - started, 3)},
        )  # fmt: skip
