"""The lock of a task whose tenant has a concurrency limit: the STATE item and one of
the tenant's seats (agentq.store.tenants) in one `TransactWriteItems`.

Both are taken or neither: a task its STATE item refuses takes no seat, and a task
with no free seat spends no attempt (`TenantAtLimit`). The first seat tried is spread
by request id; one strongly consistent query finds the free ones. A transaction
returns no attributes, so the write is conditional on the attempt it expects (0 first)
and tried again with the attempt a refusal shows (docs/scheduling.md, "Seats").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.envelope import TaskEnvelope
from agentq.errors import LockNotAcquired, TenantAtLimit
from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import idempotent, transact
from agentq.store.codec import serialize
from agentq.store.leases import Lease
from agentq.store.records import TaskRecord
from agentq.store.tenants import TenantLimitStore, free_seats, seat_start

# The lock's UpdateItem parameters for (now, effective until), and the refusal a failed
# condition means for (the item as it is, now): agentq.store.lock's.
LockRequest = Callable[[int, int], dict[str, Any]]
Refusal = Callable[[Mapping[str, Any] | None, int], LockNotAcquired]

# Transactions per acquire at most: seats taken by others between our query and our
# write are tried around; past this the tenant is as good as full.
MAX_SEAT_TRIES: Final = 4


def acquire_seated(
    seats: TenantLimitStore,
    envelope: TaskEnvelope,
    *,
    token: str,
    worker_id: str,
    lease_seconds: float,
    max_attempts: int,
    limit: int,
    lock_request: LockRequest,
    refusal: Refusal,
    first_seat: int | None = None,
) -> Lease:
    expected = 0
    allowance = 0  # the attempt allowance seen with `expected` (agentq.store.records)
    seat = seat_start(envelope.request_id, limit)
    if first_seat is not None and 0 <= first_seat < limit:
        seat = first_seat
    tried: set[int] = set()
    for _ in range(MAX_SEAT_TRIES):
        now = now_ms()
        until = now + int(lease_seconds * 1000)
        request = lock_request(now, until)
        _expect_attempt(request, expected)
        take = seats.take(envelope.tenant, seat, token=token, request_id=envelope.request_id,
                          worker_id=worker_id, until_ms=until, now=now)  # fmt: skip
        try:
            transact.write(seats.client, [{"Update": request}, {"Update": take}])
        except ClientError as error:
            found = transact.reasons(error)
            if found is None:
                raise
            if transact.code(found, 0) == transact.CONDITION:
                item = found[0].get("Item")
                if idempotent.carries(item, ("leaseToken", token)):
                    # Our own transaction, applied, its answer lost and botocore's retry
                    # refused by what it wrote (moto ignores the ClientRequestToken that
                    # makes AWS answer such a retry with success).
                    mine = TaskRecord.from_item(item) if item else None
                    attempt = mine.attempt if mine else expected + 1
                    allowance = mine.attempt_allowance if mine else allowance
                    return _lease(envelope, token, worker_id, attempt, until, seat, allowance)
                record = TaskRecord.from_item(item) if item else None
                if (
                    record is not None
                    and record.attempt != expected
                    and _lockable(record, now, max_attempts)
                ):
                    expected, allowance = record.attempt, record.attempt_allowance
                    continue
                raise refusal(item, now) from None
            if transact.code(found, 1) != transact.CONDITION:
                raise
            tried.add(seat)
            free = [
                i for i in free_seats(seats.seats(envelope.tenant), limit, now) if i not in tried
            ]
            if not free:
                raise TenantAtLimit(envelope.request_id, envelope.tenant, limit) from None
            seat = free[seat_start(envelope.request_id, len(free))]
            continue
        return _lease(envelope, token, worker_id, expected + 1, until, seat, allowance)
    raise TenantAtLimit(envelope.request_id, envelope.tenant, limit)


def _expect_attempt(request: dict[str, Any], expected: int) -> None:
    attempt = "(attribute_not_exists(#attempt) OR #attempt = :expected)" if expected == 0 else (
        "#attempt = :expected"
    )  # fmt: skip
    request["ConditionExpression"] = f"({request['ConditionExpression']}) AND {attempt}"
    request["ExpressionAttributeValues"][":expected"] = serialize(expected)
    request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"


def _lockable(record: TaskRecord, now: int, max_attempts: int) -> bool:
    """Whether the lock's condition (agentq.store.lock.LOCK_CONDITION) admits `record`."""
    if record.attempt >= record.attempt_budget(max_attempts) or record.raw.get("cancelRequested"):
        return False
    if record.state in (TaskState.PENDING, TaskState.RETRYING):
        return True
    if record.state is TaskState.SCHEDULED:
        return int(record.raw.get("notBefore") or 0) <= now
    if record.state is TaskState.PROCESSING:
        return (record.effective_until_ms or 0) < now
    return False


def _lease(
    envelope: TaskEnvelope,
    token: str,
    worker_id: str,
    attempt: int,
    until: int,
    seat: int,
    allowance: int,
) -> Lease:
    return Lease(request_id=envelope.request_id, tenant=envelope.tenant, token=token,
                 worker_id=worker_id, attempt=attempt, effective_until_ms=until,
                 seat=seat, allowance=allowance)  # fmt: skip
