"""The worker process: a receiver, N slots, one heartbeat, and a graceful drain.

The receiving threads (worker.receive.receivers) hand each message here to be placed. The
receiver long-polls only when a free slot has nothing to start, for the free slots
plus a prefetch sized to the recent start rate (worker.receive.placement), so a slot is refilled
the moment its child exits while the last task is still being settled (worker.settle.handler).
One heartbeat keeps every held message, prefetched or running, invisible and every lease
alive.

Shutdown (first SIGTERM/SIGINT): stop receiving; running tasks keep their heartbeats
until DRAIN_TIMEOUT; then they are stopped and released (their attempt costs no budget). Every
message given back without having run an attempt (prefetched, released, received while
draining) is requeued as a fresh copy (worker.sqs.batcher `give_back`): only real attempts
spend the queue's receives. A second signal exits at once. Exit codes: see `ExitCode`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from enum import IntEnum
from typing import Any, Final

from agentq.config import Settings
from agentq.signal_relay import SignalRelay
from worker.heartbeat import Heartbeat
from worker.inflight import InFlight, InFlightRegistry
from worker.receive.placement import BUFFER_AGE_FIRST_S, Held, Placement
from worker.receive.receivers import PassOn, Receiving
from worker.receive.send_back import SendBack
from worker.receive.tenant_gate import LimitedTenants
from worker.receive.tiers import TierReceiver
from worker.settle.handler import MessageHandler, Prepared
from worker.sqs.batcher import SqsBatcher, is_copy, message_log
from worker.sqs.eventbatch import EventBatcher

logger = logging.getLogger(__name__)
# Preparing is a definition lookup and one conditional write; beyond this it is stuck.
PREPARE_TIMEOUT_S: Final = 60.0
SETTLED_LINE: Final = "message settled"


class ExitCode(IntEnum):
    OK = 0  # drained: every running task finished
    ERROR = 1  # fatal error at start-up or in the main loop
    DRAIN_TIMEOUT = 3  # DRAIN_TIMEOUT passed: unfinished tasks were stopped and released
    FORCED = 4  # a second signal: children killed, exit without draining
    CONFIG = 5  # configuration error (same code as the CLI)


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
        self.tiers = TierReceiver(settings, sqs)
        self._handler = handler
        self._heartbeat = heartbeat
        self._batcher = batcher
        self._events = events
        self._inflight = inflight
        self._send_back = SendBack(batcher, self._count)
        self._on_tick = list(on_tick)
        self.slots = Placement(
            settings.max_concurrent,
            horizon_s=settings.prefetch_horizon_ms / 1000,
            ranks=self.tiers.ranks if self.tiers.multi else None,
            overtake_after_s=None
            if settings.scheduler_mode == "strict"
            else min(settings.starvation_bound_ms / 1000, BUFFER_AGE_FIRST_S),
            park_retry_s=settings.tenant_limit_backoff_ms / 1000,
            park_s=settings.tenant_limit_park_ms / 1000,
        )
        self._limited = LimitedTenants(
            settings, self.slots.seats, waits_for_seat=handler.waits_for_seat,
            waiting=handler.waiting,
        )  # fmt: skip
        # A slot frees at its child's exit while its thread settles: room for both.
        self._pool = ThreadPoolExecutor(2 * settings.max_concurrent + 1, thread_name_prefix="slot")
        self._preparer = ThreadPoolExecutor(2, thread_name_prefix="prepare")
        self._stopping = threading.Event()
        self._signals = 0
        self._retiring = False
        self._signalled = threading.Event()
        self._receiving = Receiving(
            slots=self.slots, tiers=self.tiers, note_route=batcher.routes.note,
            accept=lambda message, tier, starving, pass_on: self._accept(
                message, tier, starving=starving, pass_on=pass_on
            ),
            stopping=self._stopping,
        )  # fmt: skip
        self.received = 0
        self.verdicts: dict[str, int] = {}
        self._verdict_lock = threading.Lock()

    @property
    def heartbeats(self) -> int:
        """Heartbeat intervals that had messages to keep (each one batch of calls)."""
        return self._heartbeat.beats

    # -- running -----------------------------------------------------------------------
    def run(self) -> ExitCode:
        # The reactions run on the relay's thread: a handler that set `_signalled` while
        # this thread held its lock in `wait` would never return (agentq.signal_relay).
        relay = (
            SignalRelay(self._on_signal).install()
            if threading.current_thread() is threading.main_thread()
            else None
        )
        try:
            self._heartbeat.start()
            self._receiving.start()
            logger.info("worker started", extra={"slots": self.slots.size})
            while not self._signalled.wait(1.0):
                for tick in self._on_tick:
                    with contextlib.suppress(Exception):
                        tick()
            return self.drain()
        finally:
            if relay is not None:
                relay.uninstall()

    def stop(self) -> None:
        """Begin a graceful drain (as a first SIGTERM does)."""
        self._stopping.set()
        self._signalled.set()

    def retire(self) -> None:
        """Drain for a fresh worker (scale-in protection held for its maximum): nothing
        new starts and running tasks finish however long they run; a signal brings back
        the drain's deadline."""
        self._retiring = True
        self.stop()

    def _wait_retiring(self, deadline: float) -> float:
        while not self.slots.wait_idle(1.0):
            if self._signals:
                return time.monotonic() + self._settings.drain_timeout_ms / 1000
            for tick in self._on_tick:  # protection is renewed while tasks still run
                with contextlib.suppress(Exception):
                    tick()
        return deadline

    def _on_signal(self, signum: int) -> None:
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
        self._limited.close()  # parked messages go back with the rest of the buffer
        deadline = time.monotonic() + self._settings.drain_timeout_ms / 1000
        self._give_back(self.slots.drop_buffered(), deadline=deadline)
        # Let the receiver leave its long poll (whatever it brings back is released), so
        # no message starts once draining has begun.
        self._receiving.join(by=time.monotonic() + self._settings.wait_time_seconds + 10)
        self._give_back(self.slots.drop_buffered(), deadline=deadline)
        code = ExitCode.OK
        if self._retiring:
            deadline = self._wait_retiring(deadline)
        if not self.slots.wait_idle(max(0.0, deadline - time.monotonic())):
            code = ExitCode.DRAIN_TIMEOUT
            running = self._inflight.snapshot()
            logger.warning("drain timed out; stopping running tasks", extra={"tasks": len(running)})
            for entry in running:
                entry.stop.set("shutdown")
            self.slots.wait_idle(self._settings.kill_grace_ms / 1000 + 30)
        self._pool.shutdown(wait=True)
        self._preparer.shutdown(wait=True)
        self._limited.shutdown()
        self._heartbeat.stop()
        self._events.close()
        self._batcher.close()
        return code

    # -- placing what was received ----------------------------------------------------
    def _accept(
        self,
        message: dict[str, Any],
        tier: str,
        *,
        starving: bool = False,
        pass_on: PassOn = "never",
    ) -> bool:
        """Place a received message; True if it went straight back (its tenant parked
        full here), which tells the receive loop a flood is passing (worker.receive.receivers).

        `pass_on` (worker.receive.receivers): "if_full", a watcher's long poll asked for free slots
        only. If they filled before its message came, the message goes back to the fleet
        at once as a fresh copy, where another worker's long poll for a free slot may take
        it now; here it would wait for a hand-over. "if_surplus", the receive loop's: it
        goes back when it finds the slots full and the buffer already holding the
        prefetch (another receive took the free slots it asked for). Once only: a copy
        stays where it lands."""
        # Which message, its receive count and, for a copy, the message it replaced: what
        # the chaos verdict reads to tell a fresh copy from a receive spent in place.
        logger.info("message received", extra=message_log(message))
        if self._stopping.is_set():
            self._send_back(message, "draining")
            return False
        with self._verdict_lock:
            self.received += 1
        destination = self.tiers.destination(message, tier)
        if destination is not None:
            # Its priority names another tier: it waits there, not in this one's turn.
            try:
                self._send_back(message, "forwarded", queue_url=destination)
            except Exception:
                logger.exception("forwarding to its tier failed; running it here")
            else:
                return False
        entry = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"],
                         message=message, tier=tier, starving=starving)  # fmt: skip
        if self._inflight.add(entry) is not None:
            # Our own message, back after a lapse: the running slot now uses this handle.
            self._count("held_here")
            return False
        tenant = self._handler.limited_tenant(message)
        if tenant is not None and self._limited.parked_full(tenant, message):
            # At its limit, its parked messages here first in line for the next seat.
            self._inflight.remove(entry)
            self._send_back(message, "tenant_limit", delay_s=self._limited.backoff_s())
            self._limited.waiting(message)
            return True
        if tenant is not None:
            # Its tenant has a limit: the lock (and seat) first, a slot only if it holds.
            # On its tier's starvation turn too: a turn brings a slot's worth, and a tenant
            # at its limit would hold that many slots with refusals.
            held = (message, entry, self._limited.lock(self._handler.prepare, message, entry))
            self.slots.gate(held)
            held[2].add_done_callback(lambda _: self._gate_decided(held))
            return False
        if (
            pass_on != "never"
            and not is_copy(message)
            and (self.slots.full() if pass_on == "if_full" else self.slots.surplus())
        ):
            self._inflight.remove(entry)
            self._send_back(message, "passed_on")
            return False
        if self.slots.offer((message, entry, None), prepare=self._prepare_ahead):
            self._pool.submit(self._slot, message, entry, None)
        return False

    def _gate_decided(self, held: Held) -> None:
        """A gated message's lock is decided: start it, leave it buffered, or settle
        its refusal without a slot. While draining it stays buffered for the give-back."""
        if self._stopping.is_set():
            return
        preparation = held[2]
        try:
            ready = preparation.result(timeout=0) if preparation is not None else None
        except Exception:
            ready = None  # the slot-less settle below logs it
        outcome = self.slots.settle_gate(held, runnable=isinstance(ready, Prepared))
        if outcome == "start":
            self._pool.submit(self._slot, *held)
        elif outcome == "surplus":
            self._give_back([held])  # its lock back, the message as a fresh copy
        elif outcome == "settle":
            self._settle(*held, slotted=False)

    def _prepare_ahead(self, held: Held) -> Held:
        """Validate and lock a buffered message while it waits for a slot."""
        message, entry, _ = held
        return message, entry, self._preparer.submit(self._handler.prepare, message, entry)

    def _give_back(self, held: list[Held], *, deadline: float | None = None) -> None:
        """Messages that will not start here: unlock what was locked, requeue them fresh.

        One deadline bounds the whole give-back (a drain's, or PREPARE_TIMEOUT_S), not
        each preparation in turn: with DynamoDB unreachable, a full prefetch would
        otherwise hold a drain for minutes. A preparation not yet begun is cancelled."""
        if deadline is None:
            deadline = time.monotonic() + PREPARE_TIMEOUT_S
        for message, entry, preparation in held:
            ready: Prepared | str | None = None
            if preparation is not None and not preparation.cancel():
                left = max(0.0, min(deadline - time.monotonic(), PREPARE_TIMEOUT_S))
                try:
                    ready = preparation.result(timeout=left)
                except Exception:
                    # Still locking, or failed: if it did lock, the lease lapses and the
                    # next holder takes the task (the attempt counts, as for a crash).
                    logger.exception("preparing a prefetched message failed")
            if isinstance(ready, Prepared):
                logger.info("message given back", extra=message_log(message))
                # Its lock, then the message, fresh. The seat is not handed to a message
                # parked here: with no slot to start it either, that would only loop.
                self._handler.unprepare(ready)
                continue
            self._inflight.remove(entry)
            if isinstance(ready, str):
                self._count(ready)  # settled while preparing (a duplicate, say)
            else:
                self._send_back(message, "given_back", receipt_handle=entry.receipt_handle)

    def _slot(
        self, message: dict[str, Any], entry: InFlight, preparation: Future[Any] | None
    ) -> None:
        self._settle(message, entry, preparation, slotted=True)

    def _settle(
        self,
        message: dict[str, Any],
        entry: InFlight,
        preparation: Future[Any] | None,
        *,
        slotted: bool,
    ) -> None:
        """Handle one message, in a slot (freed when its child exits) or, for a gated
        message whose lock was refused, without one."""
        started = time.monotonic()
        # Called on this thread only: when the child exits, and again when handling ends.
        freed = not slotted

        def free_slot() -> None:
            nonlocal freed
            if freed:
                return
            freed = True
            following = self.slots.release()
            while following is not None and self._stopping.is_set():
                # Nothing new starts while draining: give it back and free the slot.
                self._give_back([following])
                following = self.slots.release()
            if following is not None:
                self._pool.submit(self._slot, *following)

        seat: int | None = None
        try:
            prepared = preparation.result(PREPARE_TIMEOUT_S) if preparation else None
            seat = prepared.lease.seat if isinstance(prepared, Prepared) else None
            verdict = self._handler.handle(
                message, entry=entry, on_child_exit=free_slot, prepared=prepared
            )
        except Exception:
            # One broken message must not take the slot (or the worker) down; SQS will
            # redeliver it after its visibility timeout and the STATE item arbitrates.
            logger.exception(
                "message handling failed", extra={"messageId": message.get("MessageId")}
            )
            self._inflight.remove(entry)
            verdict = "error"
        finally:
            free_slot()
            if slotted and entry.envelope is not None:
                # Settled: a seat it held is free, for a parked message of its tenant.
                self._limited.task_ended(entry.envelope.tenant, seat)
        self._count(verdict)
        logger.info(
            SETTLED_LINE,
            extra={"messageId": message.get("MessageId"), "verdict": verdict, "slot": slotted,
                   "seconds": round(time.monotonic() - started, 3)},
        )  # fmt: skip

    def _count(self, verdict: str) -> None:
        with self._verdict_lock:
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
