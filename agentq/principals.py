"""IAM principals mapped to tenants: which tenant a producer-API caller acts for.

An operator maps a role or a user (`agentq tenants map ARN TENANT`); the producer API
reads the caller's principal from API Gateway's `requestContext.identity.userArn` and
acts for the mapped tenant only. One item per principal in the events table:

| PK | SK | attributes |
|---|---|---|
| `PRINCIPAL#{canonical arn}` | `TENANT` | `tenant`, `principal` (as mapped), `mappedAt`, `typePK` = `PRINCIPALS`, `typeSK` = canonical arn |

The canonical ARN leaves out the IAM path: API Gateway reports an assumed role as
`arn:aws:sts::ACCT:assumed-role/ROLE/SESSION`, which carries no path, and a role's
or user's name is unique in its account whatever its path, so
`arn:aws:iam::ACCT:role/team/ROLE` and every session of it share one key. The
`byType` index lists all mappings (`typePK = PRINCIPALS`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from agentq.envelope import TENANT_PATTERN
from agentq.errors import ConfigError, InvalidInput, PrincipalNotMapped, shown
from agentq.events import now_ms
from agentq.resources import INDEX_BY_TYPE, PRINCIPAL_PK_PREFIX
from agentq.store._dynamo import query_all

MAPPING_SK: Final = "TENANT"
MAPPINGS_PK: Final = "PRINCIPALS"
MAX_ARN: Final = 2048
# IAM's own patterns: names of roles and users, role session names, paths.
_NAME: Final = r"[A-Za-z0-9_+=,.@-]{1,64}"
_SESSION: Final = r"[A-Za-z0-9_+=,.@-]{2,64}"
_PATH: Final = r"(?:/[\x21-\x7e]*)?/"
_ARN: Final = re.compile(
    r"arn:(?P<partition>aws(?:-[a-z]+){0,3}):(?P<service>iam|sts)::(?P<account>[0-9]{12}):"
    r"(?P<resource>.+)",
    re.ASCII,
)
_IAM_RESOURCE: Final = re.compile(
    rf"(?P<kind>role|user)(?P<path>{_PATH})(?P<name>{_NAME})", re.ASCII
)
_ASSUMED_ROLE: Final = re.compile(rf"assumed-role/(?P<name>{_NAME})/{_SESSION}", re.ASCII)
_PATH_MAX: Final = 512

Kind = Literal["role", "user"]


@dataclass(frozen=True)
class Principal:
    """A role or a user; `assumed` when it came from an assumed-role session's ARN."""

    partition: str
    account: str
    kind: Kind
    name: str
    assumed: bool = False

    @property
    def key(self) -> str:
        """The canonical ARN (no path): what mappings are keyed by."""
        return f"arn:{self.partition}:iam::{self.account}:{self.kind}/{self.name}"


def parse_principal(arn: object) -> Principal:
    """A role ARN (any path), a user ARN (any path) or an assumed-role session ARN.

    Anything else (the account root, federated users, other services, malformed text)
    raises InvalidInput: agentq maps only principals it can name without guessing.
    """
    if not isinstance(arn, str) or len(arn) > MAX_ARN:
        raise InvalidInput("principal", f"not an IAM principal ARN: {shown(arn)}")
    found = _ARN.fullmatch(arn)
    if found is None:
        raise InvalidInput("principal", f"not an IAM principal ARN: {shown(arn)}")
    partition, service, account = found["partition"], found["service"], found["account"]
    resource = found["resource"]
    if service == "sts":
        session = _ASSUMED_ROLE.fullmatch(resource)
        if session is None:
            raise InvalidInput(
                "principal", f"an STS principal other than an assumed role: {shown(arn)}"
            )
        return Principal(partition, account, "role", session["name"], assumed=True)
    named = _IAM_RESOURCE.fullmatch(resource)
    if named is None or len(named["path"]) > _PATH_MAX:
        raise InvalidInput("principal", f"not an IAM role or user ARN: {shown(arn)}")
    kind: Kind = "role" if named["kind"] == "role" else "user"
    return Principal(partition, account, kind, named["name"])


def mappable_principal(arn: object) -> Principal:
    """What an operator may map: a role or a user, not one session of a role."""
    principal = parse_principal(arn)
    if principal.assumed:
        raise InvalidInput(
            "principal",
            f"a role session; map its role instead ({principal.key}): every session of a "
            "role acts for the role's tenant",
        )
    return principal


def principal_pk(principal: Principal) -> str:
    return f"{PRINCIPAL_PK_PREFIX}{principal.key}"


@dataclass(frozen=True)
class PrincipalMapping:
    principal: str  # the ARN as mapped (with its path)
    key: str  # the canonical ARN
    tenant: str
    mapped_at_ms: int | None


class PrincipalTenants:
    """The mapping items. Writes are whole-item puts and deletes: a retried call
    (botocore after a lost answer, an operator running the command again) lands on the
    same item with the same value."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        self._ddb = dynamodb
        self._table = table

    def map(self, principal_arn: str, tenant: str) -> PrincipalMapping:
        principal = mappable_principal(principal_arn)
        if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
            raise InvalidInput("tenant", f"must match {TENANT_PATTERN.pattern}: {shown(tenant)}")
        mapped_at = now_ms()
        self._ddb.put_item(
            TableName=self._table,
            Item={
                "PK": {"S": principal_pk(principal)},
                "SK": {"S": MAPPING_SK},
                "tenant": {"S": tenant},
                "principal": {"S": principal_arn},
                "mappedAt": {"N": str(mapped_at)},
                INDEX_BY_TYPE.partition_key: {"S": MAPPINGS_PK},
                INDEX_BY_TYPE.sort_key: {"S": principal.key},
            },
        )
        return PrincipalMapping(principal_arn, principal.key, tenant, mapped_at)

    def unmap(self, principal_arn: str) -> PrincipalMapping | None:
        """The removed mapping, or None when there was none (or a retried delete had
        already removed it)."""
        principal = mappable_principal(principal_arn)
        answer = self._ddb.delete_item(
            TableName=self._table,
            Key={"PK": {"S": principal_pk(principal)}, "SK": {"S": MAPPING_SK}},
            ReturnValues="ALL_OLD",
        )
        old = answer.get("Attributes")
        return _mapping(old) if old else None

    def tenant_of(self, principal: Principal) -> str | None:
        """The mapped tenant, read strongly consistent so the cache's bound is the whole
        delay between an unmap and its effect. A stored tenant that is not a valid
        tenant name counts as no mapping."""
        answer = self._ddb.get_item(
            TableName=self._table,
            Key={"PK": {"S": principal_pk(principal)}, "SK": {"S": MAPPING_SK}},
            ConsistentRead=True,
            ProjectionExpression="tenant",
        )
        tenant = answer.get("Item", {}).get("tenant", {}).get("S")
        return tenant if isinstance(tenant, str) and TENANT_PATTERN.fullmatch(tenant) else None

    def all(self, tenant: str | None = None) -> list[PrincipalMapping]:
        """Every mapping (one index partition), ordered by canonical ARN; the index is
        eventually consistent, so a mapping made a moment ago may be missing."""
        items = query_all(
            self._ddb,
            TableName=self._table,
            IndexName=INDEX_BY_TYPE.name,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": INDEX_BY_TYPE.partition_key},
            ExpressionAttributeValues={":pk": {"S": MAPPINGS_PK}},
        )
        found = [_mapping(item) for item in items]
        return [m for m in found if tenant is None or m.tenant == tenant]


def _mapping(item: dict[str, Any]) -> PrincipalMapping:
    mapped_at = item.get("mappedAt", {}).get("N")
    return PrincipalMapping(
        principal=item.get("principal", {}).get("S", ""),
        key=item.get(INDEX_BY_TYPE.sort_key, {}).get(
            "S", item["PK"]["S"].removeprefix(PRINCIPAL_PK_PREFIX)
        ),
        tenant=item.get("tenant", {}).get("S", ""),
        mapped_at_ms=int(mapped_at) if mapped_at else None,
    )


class TenantResolver:
    """A caller's tenant from its principal, with each answer kept for `ttl_s`.

    The bound is the promise: a mapping removed or changed at time t is not used after
    t + ttl_s (reads are strongly consistent). A principal found unmapped is kept as
    unmapped for as long, so a refused caller's retries cost no reads; a new mapping
    works within the same bound. Failed reads are not kept.
    """

    def __init__(
        self,
        store: PrincipalTenants,
        *,
        ttl_s: float,
        account_fallback: bool,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 1024,
    ) -> None:
        self._store = store
        self._ttl = ttl_s
        self._account_fallback = account_fallback
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, str | None]] = {}

    def tenant(self, user_arn: object, account_id: object) -> str:
        """The caller's tenant, or PrincipalNotMapped (the API answers 403)."""
        try:
            principal = parse_principal(user_arn)
        except InvalidInput as exc:
            return self._fallback(account_id, exc.problem)
        tenant = self._lookup(principal)
        if tenant is not None:
            return tenant
        return self._fallback(account_id, f"{principal.key} is mapped to no tenant")

    def _fallback(self, account_id: object, problem: str) -> str:
        if (
            self._account_fallback
            and isinstance(account_id, str)
            and re.fullmatch(r"[0-9]{12}", account_id, re.ASCII)
        ):
            return account_id
        raise PrincipalNotMapped(problem)

    def _lookup(self, principal: Principal) -> str | None:
        now = self._clock()
        with self._lock:
            kept = self._cache.get(principal.key)
        if kept is not None and kept[0] > now:
            return kept[1]
        tenant = self._store.tenant_of(principal)
        if self._ttl > 0:
            with self._lock:
                if len(self._cache) >= self._max:
                    self._evict(now)
                self._cache[principal.key] = (now + self._ttl, tenant)
        return tenant

    def _evict(self, now: float) -> None:
        for key in [k for k, (until, _) in self._cache.items() if until <= now]:
            del self._cache[key]
        while len(self._cache) >= self._max:  # all live: the oldest entry goes
            del self._cache[next(iter(self._cache))]


def operator_keys(admins: str | None) -> frozenset[str]:
    """The canonical ARNs of API_DEFINITION_ADMINS (roles and users, not sessions); a
    session of an admin role is the role, as it is for a tenant mapping."""
    keys = set()
    for arn in (admins or "").split(","):
        if arn.strip():
            try:
                keys.add(mappable_principal(arn.strip()).key)
            except InvalidInput as error:
                raise ConfigError("API_DEFINITION_ADMINS", str(error)) from None
    return frozenset(keys)


def is_operator(caller_arn: object, admins: frozenset[str]) -> bool:
    """Whether API Gateway's `userArn` for a caller names one of the admins."""
    if not admins or caller_arn is None:
        return False
    try:
        return parse_principal(caller_arn).key in admins
    except InvalidInput:
        return False
