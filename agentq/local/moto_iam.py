"""IAM enforcement inside moto's server, as close to AWS's as agentq's policies need.

moto checks a signed request's identity policies, but it authorizes DynamoDB and
EventBridge calls against the resource `*` and batch/transaction calls as actions of
their own (`sqs:DeleteMessageBatch`, `dynamodb:TransactWriteItems`). agentq's roles
name their tables, indexes and bus and grant the single actions, as AWS expects, so
under moto's own rules every one of their calls would be denied, and a policy that
named the wrong table would pass. This module makes each request be checked the way
AWS checks it:

- SQS batch calls as the single action (AWS: `sqs:DeleteMessage` covers the batch);
- DynamoDB calls against the table's ARN, or the index's when the call names one;
  `TransactWriteItems`/`TransactGetItems` item by item as the item's own action on
  its table; `BatchGetItem`/`BatchWriteItem` on each table they touch;
- `events:PutEvents` against each entry's bus, `events:DescribeEventBus` against its bus;
- CloudWatch calls as `cloudwatch:<action>` (moto names them by the signing name,
  `monitoring`); S3's HeadBucket as `s3:ListBucket`, the permission AWS checks for it;
- with the request's condition keys (`s3:prefix` of a listing, `dynamodb:LeadingKeys`
  of an item call, a transaction's item or a query on the table's partition key), and
  the statements evaluated by agentq.local.iam_policy, where moto skips every condition
  operator but `StringEquals` and is never handed a key.

It also creates the admin: an IAM user holding the local stack's fixed `testing` key
with every permission, so provisioning and tests' own inspection keep working while
each component (the operator too: agentq.local.iam) signs with its own user's key.

Only the moto server process calls `enforce_iam` (`moto_server --iam`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from agentq.local.iam_policy import Decision, decide
from agentq.local.moto_guards import refuse, source_of

# Not `agentq-<stage>-operator`: the operator's own user (agentq.local.iam) has that name.
ADMIN_USER: Final = "agentq-local-admin"
ADMIN_POLICY: Final = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
ACCOUNT_ID: Final = "123456789012"  # moto's default account, which the `testing` key maps to

# TransactWriteItems item kind -> the action AWS authorizes it as.
_TRANSACT_WRITE_ACTIONS: Final = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


# SigV4 signing name -> IAM service prefix, where they differ.
_IAM_PREFIX: Final = {"monitoring": "cloudwatch"}
# Actions moto names by the API call where AWS authorizes another permission.
_AUTHORIZED_AS: Final = {"s3:HeadBucket": "s3:ListBucket"}
# `PK = :pk` (or `#pk = :pk`) in a key condition expression.
_KEY_EQUALS: Final = re.compile(r"(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)")

Context = dict[str, list[str]]
Check = tuple[str, str, Context]
# Table name -> its partition key's attribute name (None: no such table).
HashKeyOf = Callable[[str], "str | None"]


def _no_hash_key(table: str) -> str | None:
    return None


def _table_arn(region: str, account: str, table: str) -> str:
    return (
        table if table.startswith("arn:") else f"arn:aws:dynamodb:{region}:{account}:table/{table}"
    )


def _bus_arn(region: str, account: str, bus: str) -> str:
    return bus if bus.startswith("arn:") else f"arn:aws:events:{region}:{account}:event-bus/{bus}"


def _scalar(value: Any) -> str | None:
    """A DynamoDB attribute value's text (`{"S": "x"}` -> "x"); None for other shapes."""
    if isinstance(value, dict) and len(value) == 1:
        ((kind, raw),) = value.items()
        if kind in ("S", "N", "B") and isinstance(raw, str):
            return raw
    return None


def _leading_keys(request: dict[str, Any], table: str, hash_key_of: HashKeyOf) -> Context:
    """`dynamodb:LeadingKeys`: the partition key values the request names (none: absent)."""
    hash_key = hash_key_of(table)
    if hash_key is None:
        return {}
    values: list[str] = []
    for field in ("Key", "Item"):
        named = request.get(field)
        if isinstance(named, dict) and (value := _scalar(named.get(hash_key))) is not None:
            values.append(value)
    expression = request.get("KeyConditionExpression")
    if isinstance(expression, str) and "IndexName" not in request:
        names = request.get("ExpressionAttributeNames") or {}
        bound = request.get("ExpressionAttributeValues") or {}
        for name, placeholder in _KEY_EQUALS.findall(expression):
            if names.get(name, name) == hash_key and (v := _scalar(bound.get(placeholder))):
                values.append(v)
    return {"dynamodb:LeadingKeys": values} if values else {}


def _dynamodb_checks(
    name: str, body: dict[str, Any], region: str, account: str, hash_key_of: HashKeyOf
) -> list[Check]:
    if name in ("TransactWriteItems", "TransactGetItems"):
        kinds = _TRANSACT_WRITE_ACTIONS if name == "TransactWriteItems" else {"Get": "GetItem"}
        checks = []
        for item in body.get("TransactItems", []):
            for kind, action in kinds.items():
                if kind in item:
                    table = str(item[kind].get("TableName", ""))
                    checks.append((f"dynamodb:{action}", _table_arn(region, account, table),
                                   _leading_keys(item[kind], table, hash_key_of)))  # fmt: skip
        return checks
    if name in ("BatchGetItem", "BatchWriteItem"):
        checks = []
        for table, requests in body.get("RequestItems", {}).items():
            keys: list[str] = []
            if isinstance(requests, dict):  # BatchGetItem: {"Keys": [key, ...]}
                item_requests = [{"Key": key} for key in requests.get("Keys", [])]
            else:  # BatchWriteItem: [{"PutRequest": {"Item"}} | {"DeleteRequest": {"Key"}}]
                item_requests = [
                    e.get("PutRequest") or e.get("DeleteRequest") or {} for e in requests
                ]
            for request in item_requests:
                found = _leading_keys(request, str(table), hash_key_of)
                keys += found.get("dynamodb:LeadingKeys", [])
            context = {"dynamodb:LeadingKeys": keys} if keys else {}
            checks.append((f"dynamodb:{name}", _table_arn(region, account, str(table)), context))
        return checks
    named = body.get("TableName")
    if not isinstance(named, str):
        return [(f"dynamodb:{name}", "*", {})]
    arn = _table_arn(region, account, named)
    if isinstance(body.get("IndexName"), str):
        arn = f"{arn}/index/{body['IndexName']}"
    return [(f"dynamodb:{name}", arn, _leading_keys(body, named, hash_key_of))]


def _s3_context(action: str, path: str) -> Context:
    if action != "s3:ListBucket":
        return {}
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    return {"s3:prefix": query["prefix"][:1]} if "prefix" in query else {}


def authorizations(
    action: str,
    resource: str,
    body: bytes,
    *,
    region: str,
    account: str,
    path: str = "/",
    hash_key_of: HashKeyOf = _no_hash_key,
) -> list[Check]:
    """The (action, resource, condition keys) AWS would authorize for one request."""
    service, _, name = action.partition(":")
    if service in _IAM_PREFIX:
        # moto names the action by the request's signing name, IAM by the service prefix.
        service = _IAM_PREFIX[service]
        action = f"{service}:{name}"
    action = _AUTHORIZED_AS.get(action, action)
    if service == "s3":
        return [(action, resource, _s3_context(action, path))]
    if service == "sqs" and name.endswith("Batch"):
        return [(f"sqs:{name.removesuffix('Batch')}", resource, {})]
    if service not in ("dynamodb", "events"):
        return [(action, resource, {})]
    try:
        parsed = json.loads(body or b"{}")
    except ValueError:
        return [(action, resource, {})]
    if not isinstance(parsed, dict):
        return [(action, resource, {})]
    if service == "dynamodb":
        return _dynamodb_checks(name, parsed, region, account, hash_key_of) or [
            (action, resource, {})
        ]
    if name == "DescribeEventBus":
        return [(action, _bus_arn(region, account, str(parsed.get("Name") or "default")), {})]
    if name == "PutEvents":
        buses = {str(entry.get("EventBusName") or "default") for entry in parsed.get("Entries", [])}
        return [(action, _bus_arn(region, account, bus), {}) for bus in sorted(buses)] or [
            (action, resource, {})
        ]
    return [(action, resource, {})]


def request_checks(
    action: str, resource: str, body: bytes, *, region: str, account: str
) -> list[tuple[str, str]]:
    """The (action, resource) pairs AWS would authorize for one request."""
    return [(a, r) for a, r, _ in authorizations(action, resource, body, region=region,
                                                 account=account)]  # fmt: skip


def _moto_hash_key(account: str, region: str) -> HashKeyOf:
    def hash_key_of(table: str) -> str | None:
        from moto.dynamodb.models import dynamodb_backends

        try:
            name = table.rsplit("/", 1)[-1]
            return str(dynamodb_backends[account][region].get_table(name).hash_key_attr)
        except Exception:  # no such table: the call itself will say so
            return None

    return hash_key_of


def _documents(request: Any) -> list[dict[str, Any]]:
    from moto.iam.access_control import IAMPolicy

    return [IAMPolicy(policy)._policy_json for policy in request._access_key.collect_policies()]


def permits(request: Any, action: str, resource: str, context: Context) -> bool:
    """Whether the request's signer may do `action` on `resource` (identity policies)."""
    return decide(_documents(request), action, resource, context) is Decision.ALLOW


def _install_request_checks() -> None:
    from moto.iam.access_control import IAMPolicy, IAMRequestBase

    original: Callable[[Any, str], None] = IAMRequestBase.check_action_permitted
    if getattr(original, "agentq_checks", False):
        return
    init = getattr(IAMPolicy, "__init__", None)
    if init is None or "_policy_json" not in source_of(init):
        raise refuse("moto", "moto.iam.access_control.IAMPolicy no longer parses _policy_json")
    for needed in ("_access_key", "_action", "_body", "_path", "_region", "account_id"):
        if needed not in source_of(IAMRequestBase.__init__):
            raise refuse("moto", f"IAMRequestBase no longer sets {needed}")

    def check_action_permitted(self: Any, resource: str) -> None:
        if self._action == "sts:GetCallerIdentity":
            return  # AWS allows it whatever the policies say
        action = self._action
        checks = authorizations(
            action, resource, self._body, region=self._region, account=self.account_id,
            path=self._path, hash_key_of=_moto_hash_key(self.account_id, self._region),
        )  # fmt: skip
        documents = _documents(self)
        try:
            for checked_action, checked_resource, context in checks:
                self._action = checked_action  # the denial names what was checked
                if decide(documents, checked_action, checked_resource, context) is not (
                    Decision.ALLOW
                ):
                    self._raise_access_denied()
            if self._is_assuming_role_operation(resource) and not (
                self._check_role_trust_relationship(resource)
            ):
                self._raise_access_denied()
        finally:
            self._action = action

    check_action_permitted.agentq_checks = True  # type: ignore[attr-defined]
    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]


def _create_admin(access_key_id: str, secret_access_key: str) -> None:
    from moto.iam.models import iam_backends

    backend = iam_backends[ACCOUNT_ID]["aws"]
    user = backend.create_user("us-east-1", ADMIN_USER)
    backend.put_user_policy(ADMIN_USER, "everything", json.dumps(ADMIN_POLICY))
    key = user.create_access_key(prefix="AKIA")
    # The stack's fixed key, so provisioning and tests keep working without new config.
    key.access_key_id = access_key_id
    key.secret_access_key = secret_access_key


def enforce_iam(*, admin_key: str, admin_secret: str) -> None:
    """From now on every request must be signed by an IAM user and allowed by its policies."""
    from moto import settings

    _install_request_checks()
    _create_admin(admin_key, admin_secret)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # type: ignore[assignment]
