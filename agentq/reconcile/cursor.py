"""Where the reconciler resumes reading each status index partition: one cursor a partition.

A run reads at most `page` items of a partition from just after its cursor up to the
bound, then moves the cursor to the last item read (back to the start once it reached
the bound), so every item below the bound is read within ceil(N / page) + 1 runs.
Cursors are items of the events table (`RECONCILER#CURSORS`), read in one BatchGetItem
and moved by a conditional UpdateItem that holds only if the cursor is where this run
read it. Overlapping, dying and retried runs: docs/architecture.md, "Reconciler".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from agentq.resources import INDEX_BY_STATUS
from agentq.store._dynamo import condition_failed
from agentq.store.codec import values

CURSOR_PK: Final = "RECONCILER#CURSORS"
AFTER: Final = "after"
# BatchGetItem may leave keys unprocessed when throttled: asked again this many times.
BATCH_TRIES: Final = 3
BATCH_BACKOFF_S: Final = 0.05


@dataclass(frozen=True)
class Page:
    """What a run read of one partition, oldest first, and where the next run resumes
    (None: from the start, this read reached the bound)."""

    items: list[dict[str, Any]]
    resume_after: str | None


class Cursors:
    """The cursor items, and the status index reads they steer. Clients are passed in."""

    def __init__(
        self, dynamodb: Any, table_name: str, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._sleep = sleep

    def _key(self, partition: str) -> dict[str, Any]:
        return {"PK": {"S": CURSOR_PK}, "SK": {"S": partition}}

    def read(self, partitions: Sequence[str]) -> dict[str, str | None]:
        """Where each partition resumes (None: at its start). A partition whose cursor
        stayed unread (throttled) is missing from the answer."""
        unread = {partition: self._key(partition) for partition in partitions}
        found: dict[str, str | None] = {}
        for attempt in range(BATCH_TRIES):
            if attempt:
                self._sleep(BATCH_BACKOFF_S * 2**attempt)
            response = self._ddb.batch_get_item(
                RequestItems={self._table: {"Keys": list(unread.values()), "ConsistentRead": True}}
            )
            for item in response.get("Responses", {}).get(self._table, []):
                partition = item["SK"]["S"]
                after = item.get(AFTER, {}).get("S")
                found[partition] = after if isinstance(after, str) else None
                unread.pop(partition, None)
            left = response.get("UnprocessedKeys", {}).get(self._table, {}).get("Keys", [])
            left_partitions = {key["SK"]["S"] for key in left}
            for partition in list(unread):
                if partition not in left_partitions:
                    found.setdefault(partition, None)  # no item: never moved
                    del unread[partition]
            if not unread:
                break
        return found

    def page(self, partition: str, *, after: str | None, bound: str, limit: int) -> Page:
        """Up to `limit` items of `partition` after `after` and below `bound` (a status
        sort key bound, agentq.store.keys.due_bound)."""
        if after is not None and after >= bound:
            after = None  # nothing lies between the cursor and the bound: start over
        query: dict[str, Any] = {"TableName": self._table, "IndexName": INDEX_BY_STATUS.name}
        if after is None:
            query["KeyConditionExpression"] = "statusPK = :pk AND statusSK < :bound"
            query["ExpressionAttributeValues"] = values(pk=partition, bound=bound)
        else:
            # BETWEEN includes both ends: the item at the cursor is read again and
            # dropped (no status sort key equals a bare due bound, which has no suffix).
            query["KeyConditionExpression"] = (
                "statusPK = :pk AND statusSK BETWEEN :after AND :bound"
            )
            query["ExpressionAttributeValues"] = values(pk=partition, after=after, bound=bound)
        # The item at the cursor does not count: a page of 1 still moves on.
        budget = limit + (1 if after is not None else 0)
        items: list[dict[str, Any]] = []
        read = 0
        last: str | None = after
        while True:
            query["Limit"] = budget - read
            response = self._ddb.query(**query)
            for item in response.get("Items", []):
                read += 1
                last = item["statusSK"]["S"]
                if last != after:
                    items.append(item)
            next_key = response.get("LastEvaluatedKey")
            if not next_key:
                return Page(items, None)
            if read >= budget:
                return Page(items, last)
            # A 1 MB page ended before the limit: read on.
            query["ExclusiveStartKey"] = next_key

    def move(self, partition: str, *, read: str | None, to: str | None, at_ms: int) -> bool:
        """Move the cursor from where this run read it; False if another run moved it
        first (or this move was applied and retried). Not moving it costs nothing."""
        if read == to:
            return True
        names = {"#after": AFTER}
        attrs = values(now=at_ms)
        update = "SET movedAt = :now" + (", #after = :to" if to is not None else " REMOVE #after")
        if to is not None:
            attrs.update(values(to=to))
        if read is None:
            condition = "attribute_not_exists(#after)"
        else:
            condition = "#after = :read"
            attrs.update(values(read=read))
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key=self._key(partition),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=attrs,
            )
        except ClientError as error:
            if condition_failed(error):
                return False
            raise
        return True

    def walk(
        self,
        partitions: Sequence[str],
        *,
        bound: str,
        limit: int,
        now_ms: int,
        errors: list[str],
        visit: Callable[[str, list[dict[str, Any]]], None],
    ) -> None:
        """One page of each partition from its cursor: `visit(partition, items)`, then the
        cursor moves past the page. An unreadable cursor or page is an error for this run
        (the next run reads it again), never a stop for the other partitions; a cursor
        that could not be moved reads its page again next run, where what was repaired is
        skipped."""
        try:
            resume = self.read(partitions)
        except (ClientError, BotoCoreError) as error:
            errors.append(f"reconciler cursors unreadable: {error}")
            return
        for partition in partitions:
            if partition not in resume:
                errors.append(f"{partition}: cursor unread (throttled)")
                continue
            after = resume[partition]
            try:
                page = self.page(partition, after=after, bound=bound, limit=limit)
            except (ClientError, BotoCoreError) as error:
                errors.append(f"{partition}: status index unreadable: {error}")
                continue
            visit(partition, page.items)
            try:
                self.move(partition, read=after, to=page.resume_after, at_ms=now_ms)
            except (ClientError, BotoCoreError) as error:
                errors.append(f"{partition}: cursor not moved: {error}")
