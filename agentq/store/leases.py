"""Leases: the heartbeat's renewals of held locks, and what a refused renewal means.

A renewal is conditional on the lease token, the PROCESSING state and the absence of
`cancelRequested`. A refused one comes back with the item as it is
(`ReturnValuesOnConditionCheckFailure`), which tells a cancel of this very attempt
(`cancelled`) from a lease another attempt took (`lost`) without a read.

A lease that holds a tenant seat (agentq.store.tenants) renews the seat in the same
transaction: a seat another task took after it lapsed makes the lease `lost` (the
worker's fence has stopped that child already: its lease lapsed with the seat).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.errors import CancelRequested, LeaseLost
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys, transact
from agentq.store._dynamo import condition_failed
from agentq.store.codec import from_item, values
from agentq.store.tenants import TenantLimitStore

logger = logging.getLogger(__name__)

MAX_TRANSACTION_ITEMS: Final = 100
# A renewal fails once a cancel is requested: that is how the heartbeat learns of it.
# Not on `effectiveUntil`: a lapsed lease no other worker took is still its holder's (a
# taker's lock changes the token, so the two conditional writes serialize), and a
# heartbeat late under load must not cost a task an attempt.
RENEW_CONDITION: Final = (
    "leaseToken = :token AND #state = :processing AND attribute_not_exists(cancelRequested)"
)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """Proof of holding a task's lock; renew and finalize are conditional on the token."""

    request_id: str
    tenant: str
    token: str
    worker_id: str
    attempt: int
    effective_until_ms: int
    # The tenant seat this attempt holds (agentq.store.tenants), when its tenant is limited.
    seat: int | None = None
    # The task's attempt allowance as this lock found it (agentq.store.records).
    allowance: int = 0

    def attempt_budget(self, max_attempts: int) -> int:
        """The attempts this task may reach: `max_attempts`, raised by its releases."""
        return max(max_attempts, self.allowance)

    def extended(self, effective_until_ms: int) -> Lease:
        return replace(self, effective_until_ms=effective_until_ms)


@dataclass(frozen=True, kw_only=True)
class Renewals:
    renewed: list[Lease]
    lost: list[Lease]
    cancelled: list[Lease]


class LeaseRenewals:
    """The lease-renewing part of `TaskStore`."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    @property
    def _tenants(self) -> TenantLimitStore:
        return TenantLimitStore(self._ddb, self._table)

    def renew(self, lease: Lease, *, lease_seconds: float) -> Lease:
        """Extend a held lease; `LeaseLost` if another attempt owns the task now."""
        now = now_ms()
        effective_until = now + int(lease_seconds * 1000)
        if lease.seat is not None:
            return self._renew_seated(lease, now, effective_until)
        # A retried renewal meets its own condition unchanged (same token, PROCESSING),
        # so only transaction conflicts need handling here.
        try:
            idempotent.retry_conflicts(
                lambda: self._ddb.update_item(**self._renewal(lease, now, effective_until))
            )
        except ClientError as error:
            if condition_failed(error):
                item: Any = error.response.get("Item")
                if cancel_flagged(lease, item):
                    raise CancelRequested(lease.request_id) from None
                raise LeaseLost(lease.request_id, lease.token) from None
            raise
        return lease.extended(effective_until)

    def _renew_seated(self, lease: Lease, now: int, effective_until: int) -> Lease:
        # Both conditions hold again on a botocore retry of an applied renewal (same token).
        try:
            transact.write(self._ddb, self._renewal_items(lease, now, effective_until))
        except ClientError as error:
            found = transact.reasons(error)
            if found is None or transact.CONDITION not in (
                transact.code(found, 0),
                transact.code(found, 1),
            ):
                raise
            if transact.code(found, 0) == transact.CONDITION and cancel_flagged(
                lease, found[0].get("Item")
            ):
                raise CancelRequested(lease.request_id) from None
            raise LeaseLost(lease.request_id, lease.token) from None
        return lease.extended(effective_until)

    def renew_many(
        self, leases: Iterable[Lease], *, lease_seconds: float
    ) -> tuple[list[Lease], list[Lease]]:
        """(renewed, lost) of `renew_leases`, a cancel request counted as lost."""
        renewals = self.renew_leases(leases, lease_seconds=lease_seconds)
        return renewals.renewed, renewals.lost + renewals.cancelled

    def renew_leases(self, leases: Iterable[Lease], *, lease_seconds: float) -> Renewals:
        """Renew many leases with one `TransactWriteItems` per 100 items (a lease holding
        a tenant seat is two: its STATE item and its seat).

        A renewal refused because a cancel was requested (the `cancelRequested` flag,
        seen in the refused item the transaction returns: no extra read) is `cancelled`.

        One request per heartbeat instead of one per task keeps heartbeats cheap. A
        transaction is all-or-nothing, so lost leases (condition failures) are dropped
        and the rest retried; any other cancellation falls back to `renew` one by one.
        A lease in neither list could not be renewed this time (the caller tries again).
        """
        out = Renewals(renewed=[], lost=[], cancelled=[])
        for chunk in _chunks(list(leases)):
            self._renew_chunk(chunk, lease_seconds, out)
        return out

    def _renew_chunk(self, pending: list[Lease], lease_seconds: float, out: Renewals) -> None:
        while pending:
            now = now_ms()
            effective_until = now + int(lease_seconds * 1000)
            items: list[dict[str, Any]] = []
            owners: list[tuple[int, bool]] = []  # per item: (lease index, is the STATE item)
            for index, lease in enumerate(pending):
                parts = self._renewal_items(lease, now, effective_until)
                items.extend(parts)
                owners.extend((index, n == 0) for n in range(len(parts)))
            try:
                self._ddb.transact_write_items(TransactItems=items)
            except ClientError as error:
                found = transact.reasons(error)
                if found is None:
                    raise
                failed: dict[int, Any] = {}
                for position, reason in enumerate(found[: len(owners)]):
                    if reason.get("Code") == transact.CONDITION:
                        index, is_state = owners[position]
                        item = reason.get("Item") if is_state else None
                        failed[index] = failed.get(index) or item
                if not failed:
                    # A conflict, say: one by one, and one lease's error (after its
                    # own retries) must not cost the others their renewal.
                    self._renew_one_by_one(pending, lease_seconds, out)
                    return
                for index, item in failed.items():
                    seen = cancel_flagged(pending[index], item)
                    (out.cancelled if seen else out.lost).append(pending[index])
                pending = [lease for i, lease in enumerate(pending) if i not in failed]
                continue
            out.renewed.extend(lease.extended(effective_until) for lease in pending)
            return

    def _renew_one_by_one(self, pending: list[Lease], lease_seconds: float, out: Renewals) -> None:
        for lease in pending:
            try:
                out.renewed.append(self.renew(lease, lease_seconds=lease_seconds))
            except LeaseLost:
                out.lost.append(lease)
            except CancelRequested:
                out.cancelled.append(lease)
            except ClientError:
                logger.exception("renewing one lease failed; next beat retries",
                                 extra={"requestId": lease.request_id})  # fmt: skip

    def _renewal_items(self, lease: Lease, now: int, effective_until: int) -> list[dict[str, Any]]:
        items = [{"Update": self._renewal(lease, now, effective_until)}]
        if lease.seat is not None:
            seat = self._tenants.renew(lease.tenant, lease.seat, token=lease.token,
                                       until_ms=effective_until, now=now)  # fmt: skip
            items.append({"Update": seat})
        return items

    def _renewal(self, lease: Lease, now: int, effective_until: int) -> dict[str, Any]:
        return {
            "TableName": self._table,
            "Key": keys.state_key(lease.tenant, lease.request_id),
            "UpdateExpression": "SET effectiveUntil = :eu, lastHeartbeatAt = :now, statusSK = :ssk",
            "ConditionExpression": RENEW_CONDITION,
            "ExpressionAttributeNames": {"#state": "state"},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            "ExpressionAttributeValues": values(
                eu=effective_until,
                now=now,
                ssk=keys.status_sk(effective_until, lease.tenant, lease.request_id),
                token=lease.token,
                processing=TaskState.PROCESSING.value,
            ),
        }


def _chunks(leases: list[Lease]) -> list[list[Lease]]:
    """Leases in groups of at most MAX_TRANSACTION_ITEMS items."""
    chunks: list[list[Lease]] = [[]]
    size = 0
    for lease in leases:
        weight = 1 if lease.seat is None else 2
        if size + weight > MAX_TRANSACTION_ITEMS:
            chunks.append([])
            size = 0
        chunks[-1].append(lease)
        size += weight
    return [chunk for chunk in chunks if chunk]


def cancel_flagged(lease: Lease, item: Mapping[str, Any] | None) -> bool:
    """Whether a refused renewal or retryable end (the item as it is, typed) was
    refused for a cancel of this very attempt."""
    if not item:
        return False
    data = from_item(item)
    return (
        bool(data.get("cancelRequested"))
        and data.get("leaseToken") == lease.token
        and data.get("state") == TaskState.PROCESSING.value
    )
