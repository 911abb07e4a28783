"""Leases: the heartbeat's renewals of held locks, and what a refused renewal means.

A renewal is conditional on the lease token, the PROCESSING state and the absence of
`cancelRequested`. A refused one comes back with the item as it is
(`ReturnValuesOnConditionCheckFailure`), which tells a cancel of this very attempt
(`cancelled`) from a lease another attempt took (`lost`) without a read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.errors import CancelRequested, LeaseLost
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, keys
from agentq.store._dynamo import condition_failed
from agentq.store.codec import from_item, values

logger = logging.getLogger(__name__)

MAX_TRANSACTION_ITEMS: Final = 100
# A renewal fails once a cancel is requested: that is how the heartbeat learns of it.
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


@dataclass(frozen=True, kw_only=True)
class Renewals:
    renewed: list[Lease]
    lost: list[Lease]
    cancelled: list[Lease]


class LeaseRenewals:
    """The renewing half of `TaskStore` (a mixin: it uses the store's client and table)."""

    _ddb: Any
    _table: str

    @staticmethod
    def _key(tenant: str, request_id: str) -> dict[str, Any]:
        return {
            "PK": {"S": keys.task_pk(tenant, request_id)},
            "SK": {"S": keys.STATE_SK},
        }

    def renew(self, lease: Lease, *, lease_seconds: float) -> Lease:
        """Extend a held lease; `LeaseLost` if another attempt owns the task now."""
        now = now_ms()
        effective_until = now + int(lease_seconds * 1000)
        # A retried renewal meets its own condition unchanged (same token, PROCESSING),
        # so only transaction conflicts need handling here.
        try:
            idempotent.retry_conflicts(lambda: self._ddb.update_item(
                TableName=self._table,
                Key=self._key(lease.tenant, lease.request_id),
                UpdateExpression=(
                    "SET effectiveUntil = :eu, lastHeartbeatAt = :now, statusSK = :ssk"
                ),
                ConditionExpression=RENEW_CONDITION,
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues=values(
                    eu=effective_until,
                    now=now,
                    ssk=keys.status_sk(effective_until, lease.tenant, lease.request_id),
                    token=lease.token,
                    processing=TaskState.PROCESSING.value,
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            ))  # fmt: skip
        except ClientError as error:
            if condition_failed(error):
                item: Any = error.response.get("Item")
                if _cancel_requested(lease, item):
                    raise CancelRequested(lease.request_id) from None
                raise LeaseLost(lease.request_id, lease.token) from None
            raise
        return Lease(
            request_id=lease.request_id,
            tenant=lease.tenant,
            token=lease.token,
            worker_id=lease.worker_id,
            attempt=lease.attempt,
            effective_until_ms=effective_until,
        )

    def renew_many(
        self, leases: Iterable[Lease], *, lease_seconds: float
    ) -> tuple[list[Lease], list[Lease]]:
        """(renewed, lost) of `renew_leases`, a cancel request counted as lost."""
        renewals = self.renew_leases(leases, lease_seconds=lease_seconds)
        return renewals.renewed, renewals.lost + renewals.cancelled

    def renew_leases(self, leases: Iterable[Lease], *, lease_seconds: float) -> Renewals:
        """Renew many leases with one `TransactWriteItems` per 100.

        A renewal refused because a cancel was requested (the `cancelRequested` flag,
        seen in the refused item the transaction returns: no extra read) is `cancelled`.

        One request per heartbeat instead of one per task keeps heartbeats cheap. A
        transaction is all-or-nothing, so lost leases (condition failures) are dropped
        and the rest retried; any other cancellation falls back to `renew` one by one.
        A lease in neither list could not be renewed this time (the caller tries again).
        """
        renewed: list[Lease] = []
        lost: list[Lease] = []
        cancelled: list[Lease] = []
        todo = list(leases)
        for start in range(0, len(todo), MAX_TRANSACTION_ITEMS):
            pending = todo[start : start + MAX_TRANSACTION_ITEMS]
            while pending:
                now = now_ms()
                effective_until = now + int(lease_seconds * 1000)
                try:
                    self._ddb.transact_write_items(
                        TransactItems=[
                            {"Update": self._renewal(lease, now, effective_until)}
                            for lease in pending
                        ]
                    )
                except ClientError as error:
                    if (
                        error.response.get("Error", {}).get("Code")
                        != "TransactionCanceledException"
                    ):
                        raise
                    reasons = error.response.get("CancellationReasons") or []
                    failed = {
                        index
                        for index, reason in enumerate(reasons)
                        if reason.get("Code") == "ConditionalCheckFailed"
                    }
                    if not failed:
                        # A conflict, say: one by one, and one lease's error (after its
                        # own retries) must not cost the others their renewal.
                        for lease in pending:
                            try:
                                renewed.append(self.renew(lease, lease_seconds=lease_seconds))
                            except LeaseLost:
                                lost.append(lease)
                            except CancelRequested:
                                cancelled.append(lease)
                            except ClientError:
                                logger.exception("renewing one lease failed; next beat retries",
                                                 extra={"requestId": lease.request_id})  # fmt: skip
                        pending = []
                        continue
                    for i in sorted(failed):
                        item = reasons[i].get("Item")
                        seen = _cancel_requested(pending[i], item)
                        (cancelled if seen else lost).append(pending[i])
                    pending = [lease for i, lease in enumerate(pending) if i not in failed]
                    continue
                renewed.extend(
                    Lease(
                        request_id=lease.request_id,
                        tenant=lease.tenant,
                        token=lease.token,
                        worker_id=lease.worker_id,
                        attempt=lease.attempt,
                        effective_until_ms=effective_until,
                    )
                    for lease in pending
                )
                pending = []
        return Renewals(renewed=renewed, lost=lost, cancelled=cancelled)

    def _renewal(self, lease: Lease, now: int, effective_until: int) -> dict[str, Any]:
        return {
            "TableName": self._table,
            "Key": self._key(lease.tenant, lease.request_id),
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


def _cancel_requested(lease: Lease, item: Mapping[str, Any] | None) -> bool:
    """Whether a refused renewal was refused for a cancel of this very attempt."""
    if not item:
        return False
    data = from_item(item)
    return (
        bool(data.get("cancelRequested"))
        and data.get("leaseToken") == lease.token
        and data.get("state") == TaskState.PROCESSING.value
    )
