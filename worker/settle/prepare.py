"""Getting a received message ready to run: validate it, then lock its task.

The lock is a conditional update of the task's STATE item (`TaskStore.acquire`): it
holds for one worker at a time, and its lease token fences every later write. A tenant
with a concurrency limit (TENANT_CONCURRENCY_LIMIT or its override, read through a
cache) has the lock take one of its seats too, in the same transaction. What
could not be prepared is settled by worker.settle.refusals; what was prepared but will not
start here (a drain) gives its lock back.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.config import Settings
from agentq.definitions import DefinitionRegistry, TaskDefinition
from agentq.envelope import TENANT_PATTERN, TaskEnvelope, parse_message
from agentq.errors import (
    CancelRequested,
    InvalidInput,
    LeaseLost,
    LockNotAcquired,
    NotFound,
    TenantAtLimit,
)
from agentq.events import now_ms
from agentq.priority import check_priority
from agentq.resume import check_override
from agentq.states import TaskState
from agentq.store.tasks import Lease, TaskStore
from agentq.store.tenants import CachedTenantLimits, seat_start
from worker.child.leasefile import lease_times
from worker.inflight import InFlight, InFlightRegistry
from worker.parking import SeatWaits, Wake
from worker.settle.refusals import Refusals
from worker.sqs.batcher import SqsBatcher

logger = logging.getLogger(__name__)

# What the log says as a park begins and as it ends in a seat (the chaos verdict reads them).
PARKED_LINE: Final = "tenant at its concurrency limit; parked"
SEATED_LINE: Final = "parked task took a seat"


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A validated, locked task waiting for its child."""

    entry: InFlight
    envelope: TaskEnvelope
    definition: TaskDefinition
    lease: Lease
    attributes: Mapping[str, Any]
    max_attempts: int
    timeout_ms: int
    # How long the lock's write took (its retries included, a parked message's waits
    # not): DynamoDB's latency as the task met it, the LockLatency metric.
    lock_ms: int


class Preparer:
    def __init__(
        self,
        *,
        settings: Settings,
        store: TaskStore,
        batcher: SqsBatcher,
        registry: DefinitionRegistry,
        inflight: InFlightRegistry,
        worker_id: str,
        refusals: Refusals,
    ) -> None:
        self._settings = settings
        self._store = store
        self._batcher = batcher
        self._registry = registry
        self._inflight = inflight
        self._worker_id = worker_id
        self._refusals = refusals
        self._limits = CachedTenantLimits(
            store.tenant_limits(), default=settings.tenant_concurrency_limit
        )

    def limited_tenant(self, message: Mapping[str, Any]) -> str | None:
        """The message's tenant (its `tenant` attribute, as every agentq producer sets
        it) if that tenant has a concurrency limit, as last read or, for a tenant this
        worker has not read yet, as the listing of every override says (one request per
        `LIMIT_CACHE_S` for all tenants): its lock is then taken before it takes a slot
        (worker.receive.placement). So the flooding tenant an operator limited is gated from its
        first message here, not from its first lock. Unknown (the listing unreadable): gated,
        its lock reads the limit. A guess: a wrong one only moves where the lock is taken."""
        attribute = (message.get("MessageAttributes") or {}).get("tenant")
        tenant = attribute.get("StringValue") if isinstance(attribute, Mapping) else None
        # A sender's attribute: only a well-formed tenant name is used (it reaches a log
        # line when the message is sent straight back); anything else counts as none.
        if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
            tenant = self._settings.tenant_id
        limit = self._limits.guess(tenant)
        return tenant if limit is None or limit > 0 else None

    def transcripts(self, tenant: str) -> bool | None:
        """Whether `tenant` stores agent transcripts (None: its settings unreadable), from
        the cache that holds its limit: the same item, the same read."""
        return self._limits.transcripts(tenant)

    def waits_for_seat(self, message: Mapping[str, Any]) -> bool:
        """Whether `message` would only wait for its tenant's seat: a task of a definition
        this worker knows (what `prepare` checks before its first request), due now. A
        task not yet due is re-delayed until due, whatever its tenant's seats."""
        try:
            envelope = self._parse(message)
            self._registry.get(envelope.definition)
        except (InvalidInput, NotFound):
            return False
        return envelope.not_before_ms is None or envelope.not_before_ms <= now_ms()

    def _parse(self, message: Mapping[str, Any]) -> TaskEnvelope:
        envelope = parse_message(message.get("Body", ""), message.get("MessageAttributes"),
                                 default_tenant=self._settings.tenant_id)  # fmt: skip
        # A tier this deployment lacks is refused like any bad input (validation, the
        # message removed), never run on whichever queue it arrived on under its name.
        check_priority(self._settings, envelope.priority, "priority")
        return envelope

    def prepare(
        self, message: Mapping[str, Any], entry: InFlight, seats: SeatWaits | None = None
    ) -> Prepared | str:
        """Validate and lock: a task ready to run, or the verdict that settled it.

        A prefetched message is prepared while it waits for a slot, so the lock's round
        trip is off the slot's path; its lease is renewed by the heartbeat meanwhile.
        With `seats` (a gated message) a refusal for its tenant's limit parks it there
        until a seat frees (worker.parking) before it is sent back.
        """
        attributes = message.get("Attributes", {})
        try:
            envelope = self._parse(message)
            definition = self._registry.get(envelope.definition)
            # A foreign sender's `resume` for a task that keeps no session: bad input.
            check_override(definition, envelope.resume, "resume")
        except (InvalidInput, NotFound) as exc:
            return self._refusals.reject(message, exc, entry)
        entry.envelope = envelope
        receives = int(attributes.get("ApproximateReceiveCount", 1))
        if receives > self._settings.max_message_retries:
            verdict = self._refusals.too_many_receives(entry, envelope, receives, message)
            if verdict is not None:
                return verdict
        max_attempts = definition.attempts(self._settings.max_message_retries)
        timeout_ms = definition.timeout_ms(self._settings.task_timeout_ms)
        try:
            lease, lock_ms = self._lock(envelope, max_attempts, timeout_ms, seats)
        except LockNotAcquired as refusal:
            return self._refusals.refused(entry, envelope, refusal, message=message)
        entry.lease = lease
        # Arms the worker's fence and the child's lease file from the first moment.
        entry.stop.hold(lease_times(lease.effective_until_ms, self._settings))
        # Raised by attempts a shutdown released (agentq.store.records): those did not fail.
        max_attempts = lease.attempt_budget(max_attempts)
        return Prepared(entry=entry, envelope=envelope, definition=definition, lease=lease,
                        attributes=attributes, max_attempts=max_attempts,
                        timeout_ms=timeout_ms, lock_ms=lock_ms)  # fmt: skip

    def _lock(
        self, envelope: TaskEnvelope, max_attempts: int, timeout_ms: int, seats: SeatWaits | None
    ) -> tuple[Lease, int]:
        """The lease, and how long the write that took it lasted (ms)."""
        tenant = envelope.tenant
        # Not yet due: no seat, no parking; the lock refuses it and it is re-delayed
        # until due (worker.settle.refusals), not sent round at its tenant's back-off.
        due = envelope.not_before_ms is None or envelope.not_before_ms <= now_ms()
        limit = self._limits.limit(tenant) if due else 0
        if seats is not None and limit > 0 and seats.full(tenant):
            # Its tenant's parked messages here were refused within the back-off and
            # take the next seat freed here: a transaction would only be refused too.
            raise TenantAtLimit(envelope.request_id, tenant, limit)
        parked_at: float | None = None
        wake: Wake | None = None
        if seats is not None and limit > 0 and seats.refused_lately(tenant):
            # Refused here within the back-off: wait for a seat before the first try.
            parked_at, wake = self._park(envelope, seats, limit, tried=False)
        while True:
            first_seat = wake.seat if wake is not None else None
            if (
                seats is not None
                and parked_at is not None
                and wake is not None
                and not wake.freed_here
            ):
                # Its back-off passed: a seat may have freed on another worker. Look.
                free = self._free_seats(tenant, limit)
                if free == []:
                    # Still at its limit: park on without spending a transaction.
                    seats.refused(tenant)
                    wake = self._park_on(envelope, seats, limit, parked_at)
                    continue
                if free:
                    first_seat = free[seat_start(envelope.request_id, len(free))]
            began = time.monotonic()
            try:
                lease = self._store.acquire(
                    envelope, worker_id=self._worker_id,
                    lease_seconds=self._settings.lease_seconds, max_attempts=max_attempts,
                    timeout_ms=timeout_ms, tenant_limit=limit, first_seat=first_seat,
                )  # fmt: skip
            except TenantAtLimit:
                if seats is None:
                    raise
                seats.refused(tenant)
                if parked_at is None:
                    parked_at, wake = self._park(envelope, seats, limit, tried=True)
                else:
                    wake = self._park_on(envelope, seats, limit, parked_at)
                continue
            lock_ms = round((time.monotonic() - began) * 1000)
            if parked_at is not None:
                logger.info(SEATED_LINE,
                            extra={"requestId": envelope.request_id,
                                   "parked_s": round(time.monotonic() - parked_at, 3)})  # fmt: skip
            return lease, lock_ms

    def _free_seats(self, tenant: str, limit: int) -> list[int] | None:
        """The tenant's free seats, or None if the look failed: then the transaction
        decides, as it would have without the look."""
        try:
            return self._store.free_seats(tenant, limit)
        except (ClientError, BotoCoreError):
            logger.warning("looking at a tenant's seats failed; trying the lock",
                           extra={"tenant": tenant}, exc_info=True)  # fmt: skip
            return None

    def _park(
        self, envelope: TaskEnvelope, seats: SeatWaits, limit: int, *, tried: bool
    ) -> tuple[float, Wake]:
        """Park a message of a tenant at its limit until a seat may be free: its park
        time (monotonic) and why it woke; `TenantAtLimit` if it may not park or its park
        time ended."""
        if not seats.room(envelope.tenant):
            raise TenantAtLimit(envelope.request_id, envelope.tenant, limit)
        parked_at = time.monotonic()
        logger.info(PARKED_LINE,
                    extra={"requestId": envelope.request_id, "tenant": envelope.tenant,
                           "tried": tried})  # fmt: skip
        return parked_at, self._park_on(envelope, seats, limit, parked_at)

    def _park_on(
        self, envelope: TaskEnvelope, seats: SeatWaits, limit: int, parked_at: float
    ) -> Wake:
        # Its message lives here: the reconciler must not count the task lost. Marked
        # again at each wake (`WaitMarks` writes at most once per its interval), so a
        # park longer than the reconciler's bound keeps the mark fresh.
        self._refusals.waits.mark(envelope.tenant, envelope.request_id)
        wake = seats.park(envelope.tenant, parked_at)
        if wake is None:
            raise TenantAtLimit(envelope.request_id, envelope.tenant, limit)
        return wake

    def unprepare(self, prepared: Prepared) -> None:
        """A prepared task that will not start here (drain, surplus): give its lock back.

        Nothing ran and no event said it started, so the attempt is not counted (its
        number is taken again by the next lock) and no event is sent; the message
        becomes visible again for any worker. Only for a lock no slot took: once a child
        may have started, its attempt is released by the settler, never given back.
        """
        entry = prepared.entry
        entry.lease = None
        try:
            self._store.end_attempt(
                prepared.lease, TaskState.RETRYING, retry_at_ms=now_ms(),
                fields={"attempt": max(0, prepared.lease.attempt - 1),
                        "releasedBy": self._worker_id},
            )  # fmt: skip
        except CancelRequested:
            # Cancelled while it waited here: it ends now, and its message goes.
            forget = functools.partial(self._inflight.remove, entry)
            if self._refusals.cancel_held(entry, prepared.envelope, prepared.lease, forget):
                return
        except LeaseLost:
            pass
        except Exception:
            # One task's failed give-back must not abort the drain's others: its lease
            # lapses and the next holder takes the task over (the attempt counts).
            logger.exception("giving back a prepared task failed",
                             extra={"requestId": prepared.lease.request_id})  # fmt: skip
        # A fresh copy: this receive ran no attempt, so it must not count toward the DLQ.
        self._batcher.give_back(entry.receipt_handle, entry.message)
        self._inflight.remove(entry)
