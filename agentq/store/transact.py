"""`TransactWriteItems` for the lease transactions: the lock with a tenant seat, the
heartbeat's renewals and the finalize that frees a seat.

A cancelled transaction applied nothing: a `ConditionalCheckFailed` reason is the
caller's answer, a `TransactionConflict` one is sent again with jittered backoff. Each
send carries its own `ClientRequestToken`, which botocore's retries reuse, so a retry
of a transaction whose answer was lost is answered without applying it again (AWS and
the local stack alike: docs/aws-fidelity.md); a send after a conflict gets a new one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.backoff import retry
from agentq.store.idempotent import CONFLICT_ATTEMPTS, CONFLICT_BASE_S, CONFLICT_CAP_S

CANCELLED: Final = "TransactionCanceledException"
CONDITION: Final = "ConditionalCheckFailed"
CONFLICT: Final = "TransactionConflict"


def reasons(error: ClientError) -> list[Mapping[str, Any]] | None:
    """The per-item reasons of a cancelled transaction, None for any other error."""
    if error.response.get("Error", {}).get("Code") != CANCELLED:
        return None
    found: Any = error.response.get("CancellationReasons") or []
    return [r if isinstance(r, Mapping) else {} for r in found]


def code(found: Sequence[Mapping[str, Any]], index: int) -> str:
    return str(found[index].get("Code") or "None") if index < len(found) else "None"


def write(
    ddb: Any,
    items: list[dict[str, Any]],
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Send one transaction, again after a conflict; a failed condition is raised."""

    def conflicted_only(error: Exception) -> bool:
        found = reasons(error) if isinstance(error, ClientError) else None
        conflict = found is not None and any(r.get("Code") == CONFLICT for r in found)
        failed = found is not None and any(r.get("Code") == CONDITION for r in found)
        return conflict and not failed

    retry(
        lambda: ddb.transact_write_items(TransactItems=items, ClientRequestToken=uuid.uuid4().hex),
        retryable=conflicted_only,
        attempts=attempts,
        base_s=CONFLICT_BASE_S,
        cap_s=CONFLICT_CAP_S,
        sleep=sleep,
    )
