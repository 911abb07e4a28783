"""Per-tenant settings (concurrency limit, transcripts off), their cache, and the seats.

A tenant's limit is `TENANT_CONCURRENCY_LIMIT` unless its settings item
(`TENANT#{tenant}` / `LIMITS`) says otherwise; 0 is unlimited. The same item may say
`transcripts: off`: its agent tasks store no session checkpoint (no resume, no
continue). `CachedTenantLimits` reads the item at most once per tenant and worker per
`LIMIT_CACHE_S`, and guesses an unread tenant's limit from one listing of every
override, which no thread waits for. A limit of N is N seats (`TENANT#{tenant}` /
`SEAT#{i}`), each held like a lease by a task's lease token until its `leaseUntil`
(docs/scheduling.md, "Seats").
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentq.envelope import TENANT_PATTERN
from agentq.errors import InvalidInput, shown
from agentq.events import now_ms
from agentq.resources import INDEX_BY_TENANT, TENANT_PK_PREFIX
from agentq.store._dynamo import query_all
from agentq.store.codec import from_item, to_item, values

logger = logging.getLogger(__name__)

LIMITS_SK: Final = "LIMITS"
SEAT_SK_PREFIX: Final = "SEAT#"
# Every override also sits in one partition of the byTenant index, so `agentq tenants
# show` lists them with a query, never a scan of the table.
LIMITS_LISTING_PK: Final = "TENANTS#LIMITS"
MAX_LIMIT: Final = 1_000
# Long enough that a busy tenant's limit costs a worker ~2 reads a minute; short enough
# that an operator's change reaches the whole fleet within half a minute.
LIMIT_CACHE_S: Final = 30.0
# After a failed read the fallback answer is kept this long, so a throttled table is not
# asked again for every task.
LIMIT_RETRY_S: Final = 5.0
# A seat nobody has taken for a day disappears (TTL); an idle tenant leaves no items.
SEAT_TTL_S: Final = 86_400


def tenant_pk(tenant: str) -> str:
    return f"{TENANT_PK_PREFIX}{tenant}"


def seat_sk(index: int) -> str:
    return f"{SEAT_SK_PREFIX}{index:04d}"


def validate_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        raise InvalidInput("tenant", f"must match {TENANT_PATTERN.pattern}, got {shown(tenant)}")
    return tenant


def validate_limit(limit: object) -> int:
    """A concurrency limit as given by an operator: an int in [0, MAX_LIMIT]."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT:
        raise InvalidInput("limit", f"must be an integer from 0 to {MAX_LIMIT}, got {shown(limit)}")
    return limit


def stored_limit(value: object) -> int | None:
    """An override as read from the table, or None when it is not a valid limit.

    The table is shared with other writers: a malformed value must neither crash the
    worker nor become a limit (it is ignored, and the default applies)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if math.isnan(value) or not 0 <= value <= MAX_LIMIT or int(value) != value:
        return None
    return int(value)


def seat_start(request_id: str, limit: int) -> int:
    """The first seat a task tries: spread by request id, so tasks of one tenant taking
    seats at the same moment rarely ask for the same one."""
    return zlib.crc32(request_id.encode()) % limit


@dataclass(frozen=True, kw_only=True)
class Seat:
    index: int
    holder: str | None
    request_id: str | None
    worker_id: str | None
    lease_until_ms: int

    def live(self, at_ms: int) -> bool:
        return self.holder is not None and self.lease_until_ms >= at_ms

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> Seat | None:
        data = from_item(item)
        try:
            index = int(str(data["SK"])[len(SEAT_SK_PREFIX) :])
        except (KeyError, ValueError):
            return None
        holder = data.get("holder")
        until = data.get("leaseUntil")
        return cls(
            index=index,
            holder=holder if isinstance(holder, str) else None,
            request_id=data.get("requestId") if isinstance(data.get("requestId"), str) else None,
            worker_id=data.get("worker") if isinstance(data.get("worker"), str) else None,
            lease_until_ms=until if isinstance(until, int) else 0,
        )


def free_seats(seats: Iterable[Seat], limit: int, at_ms: int) -> list[int]:
    """Indices below `limit` that no live lease holds (a missing item is a free seat)."""
    busy = {seat.index for seat in seats if seat.live(at_ms)}
    return [index for index in range(limit) if index not in busy]


TRANSCRIPTS_OFF: Final = "off"
# An operator's settings change is a read then a conditional put (the operator may put
# and delete tenant items, not update them); a concurrent change makes it read again.
_SETTINGS_WRITE_TRIES: Final = 5
# A limit's put or delete needs no read while the item holds no other setting.
_NO_OTHER_SETTING: Final = "attribute_not_exists(transcripts)"


@dataclass(frozen=True, kw_only=True)
class TenantSettings:
    """A tenant's settings item as read: its limit override (None: the default) and
    whether its transcripts are stored."""

    limit: int | None = None
    transcripts: bool = True


def stored_settings(data: Mapping[str, Any]) -> TenantSettings:
    """Settings from an item of the shared table: only the exact word `off` turns
    transcripts off, and a malformed limit is no override."""
    return TenantSettings(limit=stored_limit(data.get("concurrencyLimit")),
                          transcripts=data.get("transcripts") != TRANSCRIPTS_OFF)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TenantLimit:
    tenant: str
    limit: int
    updated_at_ms: int | None


class TenantLimitStore:
    """Overrides and seats in the events table. The DynamoDB client is passed in."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    @property
    def client(self) -> Any:
        return self._ddb

    def _key(self, tenant: str, sort_key: str) -> dict[str, Any]:
        return {"PK": {"S": tenant_pk(tenant)}, "SK": {"S": sort_key}}

    def get(self, tenant: str, *, consistent: bool = False) -> int | None:
        """The tenant's override, or None. Eventually consistent unless `consistent`: the
        cache is older anyway; an operator reading back what they set reads strongly."""
        item = self._ddb.get_item(
            TableName=self._table, Key=self._key(tenant, LIMITS_SK), ConsistentRead=consistent
        ).get("Item")
        return stored_limit(from_item(item).get("concurrencyLimit")) if item else None

    def settings(self, tenant: str, *, consistent: bool = False) -> TenantSettings:
        """The tenant's settings item (the defaults when it has none)."""
        item = self._ddb.get_item(
            TableName=self._table, Key=self._key(tenant, LIMITS_SK), ConsistentRead=consistent
        ).get("Item")
        return stored_settings(from_item(item)) if item else TenantSettings()

    def set(self, tenant: str, limit: int) -> None:
        """Set an override; the tenant's other settings stay. One put when the item holds
        no other setting (a retried one writes the same again), else read and put back."""
        validate_tenant(tenant)
        validate_limit(limit)
        item = {
            "PK": tenant_pk(tenant),
            "SK": LIMITS_SK,
            "tenant": tenant,
            "concurrencyLimit": limit,
            "updatedAt": now_ms(),
            INDEX_BY_TENANT.partition_key: LIMITS_LISTING_PK,
            INDEX_BY_TENANT.sort_key: tenant,
        }
        try:
            self._ddb.put_item(TableName=self._table, Item=to_item(item),
                               ConditionExpression=_NO_OTHER_SETTING)  # fmt: skip
        except self._ddb.exceptions.ConditionalCheckFailedException:
            self._change(tenant, concurrencyLimit=limit)

    def clear(self, tenant: str) -> None:
        """Remove an override: the tenant gets TENANT_CONCURRENCY_LIMIT again (its item
        goes, unless it holds another setting)."""
        validate_tenant(tenant)
        try:
            self._ddb.delete_item(TableName=self._table, Key=self._key(tenant, LIMITS_SK),
                                  ConditionExpression=_NO_OTHER_SETTING)  # fmt: skip
        except self._ddb.exceptions.ConditionalCheckFailedException:
            self._change(tenant, concurrencyLimit=None)

    def set_transcripts(self, tenant: str, *, stored: bool) -> None:
        """Whether the tenant's agent tasks may store their session transcripts."""
        validate_tenant(tenant)
        self._change(tenant, transcripts=None if stored else TRANSCRIPTS_OFF)

    def _change(self, tenant: str, **changes: Any) -> None:
        """Read the item, change it, put it back unless someone changed it meanwhile (then
        read again); an item left with no setting is deleted. The operator may put and
        delete tenant items, not update them (docs/least-privilege.md). A put or delete that was
        applied and retried by botocore meets its own result: the condition fails, the
        read shows the change made, and the next try writes the same again."""
        key = self._key(tenant, LIMITS_SK)
        for _ in range(_SETTINGS_WRITE_TRIES):
            found = self._ddb.get_item(TableName=self._table, Key=key,
                                       ConsistentRead=True).get("Item")  # fmt: skip
            data = from_item(found) if found else {}
            seen = data.get("updatedAt")
            for name, value in changes.items():
                if value is None:
                    data.pop(name, None)
                else:
                    data[name] = value
            condition: dict[str, Any] = (
                {"ConditionExpression": "updatedAt = :seen",
                 "ExpressionAttributeValues": values(seen=seen)}
                if isinstance(seen, int)
                else {"ConditionExpression": "attribute_not_exists(PK) OR "
                                             "attribute_not_exists(updatedAt)"}
            )  # fmt: skip
            try:
                if "concurrencyLimit" not in data and "transcripts" not in data:
                    if found:
                        self._ddb.delete_item(TableName=self._table, Key=key, **condition)
                    return
                data.update({
                    "PK": tenant_pk(tenant), "SK": LIMITS_SK, "tenant": tenant,
                    "updatedAt": max(now_ms(), seen + 1 if isinstance(seen, int) else 0),
                    INDEX_BY_TENANT.partition_key: LIMITS_LISTING_PK,
                    INDEX_BY_TENANT.sort_key: tenant,
                })  # fmt: skip
                self._ddb.put_item(TableName=self._table, Item=to_item(data), **condition)
                return
            except self._ddb.exceptions.ConditionalCheckFailedException:
                continue
        raise InvalidInput("tenant", f"the settings of {tenant} changed under every try: "
                           "try again")  # fmt: skip

    def transcripts_off(self) -> list[str]:
        """Tenants whose transcripts are off (from the listing of every settings item)."""
        found = (from_item(item) for item in self._settings_items())
        return sorted(str(d.get("tenant")) for d in found
                      if d.get("transcripts") == TRANSCRIPTS_OFF
                      and isinstance(d.get("tenant"), str))  # fmt: skip

    def _settings_items(self) -> list[dict[str, Any]]:
        """Every tenant's settings item, from the listing index."""
        return query_all(
            self._ddb,
            TableName=self._table,
            IndexName=INDEX_BY_TENANT.name,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": INDEX_BY_TENANT.partition_key},
            ExpressionAttributeValues=values(pk=LIMITS_LISTING_PK),
        )

    def overrides(self) -> list[TenantLimit]:
        found = []
        for item in self._settings_items():
            data = from_item(item)
            limit = stored_limit(data.get("concurrencyLimit"))
            tenant = data.get("tenant")
            if limit is None or not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
                continue
            updated = data.get("updatedAt")
            found.append(TenantLimit(tenant=tenant, limit=limit,
                                     updated_at_ms=updated if isinstance(updated, int) else None))  # fmt: skip
        return sorted(found, key=lambda t: t.tenant)

    def seats(self, tenant: str) -> list[Seat]:
        """Every seat item of a tenant, strongly consistent (the lock decides on it)."""
        items = query_all(
            self._ddb,
            TableName=self._table,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :seat)",
            ExpressionAttributeValues=values(pk=tenant_pk(tenant), seat=SEAT_SK_PREFIX),
            ConsistentRead=True,
        )
        return [seat for item in items if (seat := Seat.from_item(item)) is not None]

    # -- the seat's parts of the lease transactions --------------------------------
    def take(self, tenant: str, index: int, *, token: str, request_id: str, worker_id: str,
             until_ms: int, now: int) -> dict[str, Any]:  # fmt: skip
        """Take a free or lapsed seat (a `TransactWriteItems` Update)."""
        return {
            "TableName": self._table,
            "Key": self._key(tenant, seat_sk(index)),
            "UpdateExpression": "SET #holder = :token, leaseUntil = :until, requestId = :rid, "
            "#worker = :worker, #ttl = :ttl",
            "ConditionExpression": "attribute_not_exists(#holder) OR leaseUntil < :now",
            "ExpressionAttributeNames": {"#holder": "holder", "#worker": "worker", "#ttl": "ttl"},
            "ExpressionAttributeValues": values(
                token=token,
                until=until_ms,
                rid=request_id,
                worker=worker_id,
                now=now,
                ttl=until_ms // 1000 + SEAT_TTL_S,
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def renew(self, tenant: str, index: int, *, token: str, until_ms: int,
              now: int) -> dict[str, Any]:  # fmt: skip
        """Extend a held seat. One that lapsed and was not taken since is taken back: the
        task's own lease is the judge of whether the attempt still runs."""
        return {
            "TableName": self._table,
            "Key": self._key(tenant, seat_sk(index)),
            "UpdateExpression": "SET #holder = :token, leaseUntil = :until, #ttl = :ttl",
            "ConditionExpression": "#holder = :token OR attribute_not_exists(#holder) "
            "OR leaseUntil < :now",
            "ExpressionAttributeNames": {"#holder": "holder", "#ttl": "ttl"},
            "ExpressionAttributeValues": values(
                token=token, until=until_ms, now=now, ttl=until_ms // 1000 + SEAT_TTL_S
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def free(self, tenant: str, index: int, *, token: str) -> dict[str, Any]:
        """Give a held seat back (only while this lease still holds it)."""
        return {
            "TableName": self._table,
            "Key": self._key(tenant, seat_sk(index)),
            "UpdateExpression": "SET leaseUntil = :zero REMOVE #holder, requestId, #worker",
            "ConditionExpression": "#holder = :token",
            "ExpressionAttributeNames": {"#holder": "holder", "#worker": "worker"},
            "ExpressionAttributeValues": values(token=token, zero=0),
        }


class CachedTenantLimits:
    """Each tenant's effective limit (0: unlimited) and whether it stores transcripts,
    read at most once per `ttl_s` (one item holds both)."""

    def __init__(
        self,
        store: TenantLimitStore,
        *,
        default: int,
        ttl_s: float = LIMIT_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._default = default
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # Until when, the limit, and whether transcripts are stored (None: never read).
        self._known: dict[str, tuple[float, int, bool | None]] = {}
        self._listing = threading.Lock()
        # Until when, and what, the listing of every override said (None: unreadable).
        self._listed: tuple[float, dict[str, int] | None] | None = None

    def limit(self, tenant: str) -> int:
        return self._read(tenant)[0]

    def transcripts(self, tenant: str) -> bool | None:
        """Whether the tenant's transcripts may be stored; None when its settings could
        not be read (and never were): the caller then stores nothing."""
        return self._read(tenant)[1]

    def _read(self, tenant: str) -> tuple[int, bool | None]:
        now = self._clock()
        with self._lock:
            cached = self._known.get(tenant)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        try:
            found = self._store.settings(tenant)
        except Exception:
            # Throttled past botocore's retries, say: the last answer (or the default)
            # stands for a few seconds rather than holding the task back.
            fallback = cached[1] if cached is not None else self._default
            transcripts = cached[2] if cached is not None else None
            logger.warning("reading a tenant's settings failed; using limit %s", fallback,
                           extra={"tenant": tenant}, exc_info=True)  # fmt: skip
            with self._lock:
                self._known[tenant] = (now + LIMIT_RETRY_S, fallback, transcripts)
            return fallback, transcripts
        limit = self._default if found.limit is None else found.limit
        with self._lock:
            self._known[tenant] = (now + self._ttl_s, limit, found.transcripts)
        return limit, found.transcripts

    def guess(self, tenant: str) -> int | None:
        """The tenant's limit for a guess on a hot path, which `limit` then settles: as
        last read, however old; for a tenant never read, its override in the listing of
        every override (one `Query` per `ttl_s` for all tenants, however many) or the
        default; None if that listing cannot be read now."""
        with self._lock:
            cached = self._known.get(tenant)
        if cached is not None:
            return cached[1]
        overrides = self._overrides()
        return None if overrides is None else overrides.get(tenant, self._default)

    def _overrides(self) -> dict[str, int] | None:
        listed = self._listed
        if listed is not None and listed[0] > self._clock():
            return listed[1]
        # One listing at a time, and nobody waits for it: a throttled Query retries for
        # seconds, and the callers are the threads that receive. Meanwhile the last
        # listing stands, however old; before the first, there is no guess (None).
        if not self._listing.acquire(blocking=False):
            return listed[1] if listed is not None else None
        try:
            now = self._clock()
            if self._listed is not None and self._listed[0] > now:
                return self._listed[1]  # listed while this thread came
            try:
                found: dict[str, int] | None = {
                    override.tenant: override.limit for override in self._store.overrides()
                }
            except Exception:
                logger.warning("listing the tenants' concurrency limits failed", exc_info=True)
                found = None
            self._listed = (now + (self._ttl_s if found is not None else LIMIT_RETRY_S), found)
            return found
        finally:
            self._listing.release()
