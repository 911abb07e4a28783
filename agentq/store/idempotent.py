"""Conditional writes that stay correct when DynamoDB answers late or not at all.

Two faults turn a correct conditional write into a wrong answer:

- botocore retries a write whose first try was applied but whose answer was lost (a
  500, a read timeout). The retry's condition then fails against the write's own
  effect. Each write therefore sets a *mark* (its lease token or a fresh write id), and
  a failed condition whose current item carries that mark is the write succeeding.
- `TransactionConflictException`: an item was part of a concurrent
  `TransactWriteItems` (the heartbeat renews leases in one). botocore's standard mode
  does not retry it; DynamoDB rejected the write without applying it, so it is safe to
  send again, with bounded jittered backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from botocore.exceptions import ClientError

from agentq.backoff import retry
from agentq.store._dynamo import condition_failed

T = TypeVar("T")

TRANSACTION_CONFLICT: Final = "TransactionConflictException"
WRITE_ID: Final = "writeId"
CONFLICT_ATTEMPTS: Final = 8
CONFLICT_BASE_S: Final = 0.025
CONFLICT_CAP_S: Final = 1.0


def transaction_conflict(error: ClientError) -> bool:
    return bool(error.response.get("Error", {}).get("Code") == TRANSACTION_CONFLICT)


def retry_conflicts(
    call: Callable[[], T],
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, sent again after a transaction conflict (full-jitter backoff).

    A transaction holds its items for milliseconds; eight tries spread over up to ~3 s
    outlast any heartbeat's. The last conflict is raised.
    """
    return retry(
        call,
        retryable=lambda error: isinstance(error, ClientError) and transaction_conflict(error),
        attempts=attempts,
        base_s=CONFLICT_BASE_S,
        cap_s=CONFLICT_CAP_S,
        sleep=sleep,
    )


@dataclass(frozen=True)
class Written:
    """A conditional write's outcome: `item` is the new item when `written`, else the
    item as it is (None if absent or not returned)."""

    written: bool
    item: Mapping[str, Any] | None


def carries(item: Mapping[str, Any] | None, mark: tuple[str, str]) -> bool:
    """Whether a raw (typed) item holds the string attribute `mark`."""
    if not item:
        return False
    value = item.get(mark[0])
    return isinstance(value, Mapping) and value.get("S") == mark[1]


def update(ddb: Any, *, mark: tuple[str, str], **request: Any) -> Written:
    """A conditional `UpdateItem` whose expression sets `mark` (attribute, value)."""
    request.setdefault("ReturnValuesOnConditionCheckFailure", "ALL_OLD")
    try:
        response = retry_conflicts(lambda: ddb.update_item(**request))
    except ClientError as error:
        if not condition_failed(error):
            raise
        return _refused_or_ours(error, mark)
    return Written(True, response.get("Attributes"))


def put(ddb: Any, *, mark: tuple[str, str], **request: Any) -> Written:
    """A conditional `PutItem` of an item that holds `mark`."""
    request.setdefault("ReturnValuesOnConditionCheckFailure", "ALL_OLD")
    try:
        retry_conflicts(lambda: ddb.put_item(**request))
    except ClientError as error:
        if not condition_failed(error):
            raise
        return _refused_or_ours(error, mark)
    return Written(True, request["Item"])


def _refused_or_ours(error: ClientError, mark: tuple[str, str]) -> Written:
    item: Mapping[str, Any] | None = error.response.get("Item")  # type: ignore[assignment]
    # Our own earlier try, applied: the state we wanted is there with our mark.
    return Written(carries(item, mark), item)
