"""One strongly consistent BatchGetItem read of up to 100 keys, unprocessed keys included.

DynamoDB may answer a batch read in part (throttling, size): the keys it left are in
`UnprocessedKeys` and are asked for again after a growing pause (agentq.backoff).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentq.backoff import compute_backoff


def batch_get(
    dynamodb: Any,
    table: str,
    keys: Sequence[Mapping[str, Any]],
    *,
    attempts: int,
    base_s: float,
    cap_s: float,
    options: Mapping[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[dict[str, Any]], int]:
    """The items found, and how many keys were still unprocessed after `attempts` reads.

    `options` joins the table's request (a projection, its attribute names).
    """
    pending: dict[str, Any] = {
        table: {"Keys": list(keys), "ConsistentRead": True, **(options or {})}
    }
    items: list[dict[str, Any]] = []
    for attempt in range(attempts):
        if attempt:
            sleep(compute_backoff(attempt, base_s=base_s, cap_s=cap_s, jitter=False))
        response = dynamodb.batch_get_item(RequestItems=pending)
        items += response.get("Responses", {}).get(table, [])
        pending = response.get("UnprocessedKeys") or {}
        if not pending:
            return items, 0
    return items, len(pending.get(table, {}).get("Keys", []))
