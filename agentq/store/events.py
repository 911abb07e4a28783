"""Event items of the events table: idempotent append and the timeline queries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from botocore.exceptions import ClientError

from agentq.events import Event, iso_ms
from agentq.store import keys
from agentq.store._dynamo import condition_failed, query_all
from agentq.store.codec import from_item, to_item, values

_DAY_MS: Final = 86_400_000


def event_item(event: Event, *, app_name: str, ttl_days: int = 0) -> dict[str, Any]:
    """The table item for an event (plain values; see codec.to_item)."""
    detail = event.to_detail()
    if event.detail_type.startswith("Job"):
        pk = keys.job_pk(event.tenant, str(event.job_id))
    else:
        pk = keys.task_pk(event.tenant, event.request_id)
    item: dict[str, Any] = {
        "PK": pk,
        "SK": keys.event_sk(event.timestamp, event.event_id),
        **{k: v for k, v in detail.items() if v is not None},
        "tenantPK": keys.tenant_events_pk(event.tenant),
        "tenantSK": f"{event.timestamp}#{event.event_id}",
        "typePK": keys.type_pk(app_name, event.detail_type),
        "typeSK": f"{event.timestamp}#{event.event_id}",
    }
    if ttl_days > 0:
        item["ttl"] = (event.timestamp_ms + ttl_days * _DAY_MS) // 1000
    return item


class EventStore:
    """Appends events and reads them back. The DynamoDB client is passed in."""

    def __init__(self, dynamodb: Any, table_name: str, *, app_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._app = app_name

    def append(self, event: Event, *, ttl_days: int = 0) -> bool:
        """Store an event once; a redelivered event (same id and time) is a no-op.

        Returns whether this call stored it.
        """
        item = event_item(event, app_name=self._app, ttl_days=ttl_days)
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item=to_item(item),
                ConditionExpression="attribute_not_exists(PK)",
            )
        except ClientError as error:
            if condition_failed(error):
                return False
            raise
        return True

    def timeline(self, tenant: str, request_id: str) -> list[dict[str, Any]]:
        """A task's events, oldest first (main table, no index)."""
        return self._query(
            KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
            ExpressionAttributeValues=values(
                pk=keys.task_pk(tenant, request_id), prefix=keys.EVENT_SK_PREFIX
            ),
        )

    def latest(self, tenant: str, request_id: str) -> dict[str, Any] | None:
        """A task's most recent event (one item read, newest first)."""
        response = self._ddb.query(
            TableName=self._table,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
            ExpressionAttributeValues=values(
                pk=keys.task_pk(tenant, request_id), prefix=keys.EVENT_SK_PREFIX
            ),
            ScanIndexForward=False,
            Limit=1,
        )
        items = response.get("Items", [])
        return from_item(items[0]) if items else None

    def job_timeline(self, tenant: str, job_id: str) -> list[dict[str, Any]]:
        return self._query(
            KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
            ExpressionAttributeValues=values(
                pk=keys.job_pk(tenant, job_id), prefix=keys.EVENT_SK_PREFIX
            ),
        )

    def tenant_events(
        self, tenant: str, *, since_ms: int = 0, until_ms: int | None = None
    ) -> list[dict[str, Any]]:
        """A tenant's events by time, through the byTenant index."""
        return self._between("byTenant", "tenantPK", "tenantSK",
                             keys.tenant_events_pk(tenant), since_ms, until_ms)  # fmt: skip

    def newest_tenant_events(self, tenant: str, *, limit: int) -> list[dict[str, Any]]:
        """A tenant's newest `limit` events (at most 1 MB of them), newest first: one
        Query of the byTenant index, however many events the tenant has."""
        response = self._ddb.query(
            TableName=self._table,
            IndexName="byTenant",
            KeyConditionExpression="tenantPK = :pk",
            ExpressionAttributeValues=values(pk=keys.tenant_events_pk(tenant)),
            ScanIndexForward=False,
            Limit=limit,
        )
        return [from_item(item) for item in response.get("Items", [])]

    def search_tenant_events(
        self,
        tenant: str,
        *,
        since_ms: int | None,
        until_ms: int | None,
        id_contains: str | None,
        budget: int,
    ) -> Iterator[tuple[list[dict[str, Any]], bool]]:
        """A tenant's events of tasks on their own (no job), newest first, in a time
        range and with `id_contains` in the request id: DynamoDB filters, at most `budget`
        events read (filtered or not). Yields each page's events and whether the range is
        now read to its end; a caller that has what it needs stops reading there."""
        query: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": "byTenant",
            "KeyConditionExpression": "tenantPK = :pk AND tenantSK BETWEEN :lo AND :hi",
            "FilterExpression": "begins_with(detailType, :task) AND attribute_not_exists(jobId)",
            "ExpressionAttributeValues": values(
                pk=keys.tenant_events_pk(tenant),
                lo=iso_ms(since_ms or 0),
                hi=iso_ms(until_ms) + "~" if until_ms is not None else "~",
                task="Task ",
            ),
            "ScanIndexForward": False,
        }
        if id_contains:
            query["FilterExpression"] += " AND contains(requestId, :text)"
            query["ExpressionAttributeValues"].update(values(text=id_contains))
        read = 0
        while read < budget:
            response = self._ddb.query(Limit=budget - read, **query)
            read += int(response.get("ScannedCount", 0)) or len(response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            yield [from_item(item) for item in response.get("Items", [])], not last
            if not last:
                return
            query["ExclusiveStartKey"] = last

    def events_by_type(
        self, detail_type: str, *, since_ms: int = 0, until_ms: int | None = None
    ) -> list[dict[str, Any]]:
        """Events of one detail type by time, through the byType index."""
        return self._between("byType", "typePK", "typeSK",
                             keys.type_pk(self._app, detail_type), since_ms, until_ms)  # fmt: skip

    def _between(
        self, index: str, pk_name: str, sk_name: str, pk: str, since_ms: int, until_ms: int | None
    ) -> list[dict[str, Any]]:
        upper = iso_ms(until_ms) + "~" if until_ms is not None else "~"
        return self._query(
            IndexName=index,
            KeyConditionExpression=f"{pk_name} = :pk AND {sk_name} BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(pk=pk, lo=iso_ms(since_ms), hi=upper),
        )

    def _query(self, **query: Any) -> list[dict[str, Any]]:
        items = query_all(self._ddb, TableName=self._table, **query)
        return [from_item(item) for item in items]
