"""Small DynamoDB helpers shared by the store modules."""

from __future__ import annotations

from typing import Any, Final

from botocore.exceptions import ClientError

CONDITION_FAILED: Final = "ConditionalCheckFailedException"


def condition_failed(error: ClientError) -> bool:
    return bool(error.response.get("Error", {}).get("Code") == CONDITION_FAILED)


def query_all(ddb: Any, *, limit: int | None = None, **query: Any) -> list[dict[str, Any]]:
    """Follow LastEvaluatedKey until done (or `limit` items)."""
    items: list[dict[str, Any]] = []
    while True:
        response = ddb.query(**query)
        items.extend(response.get("Items", []))
        if limit is not None and len(items) >= limit:
            return items[:limit]
        last = response.get("LastEvaluatedKey")
        if not last:
            return items
        query["ExclusiveStartKey"] = last
