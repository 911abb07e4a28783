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
- `events:PutEvents` against each entry's bus;
- CloudWatch calls as `cloudwatch:<action>` (moto names them by the signing name,
  `monitoring`).

It also creates the operator: an IAM user holding the local stack's fixed
`testing` key with every permission, so provisioning, tests and `agentq` commands an
operator runs keep working while each component signs with its own user's key.

Only the moto server process calls `enforce_iam` (`moto_server --iam`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

OPERATOR_USER: Final = "agentq-local-operator"
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


def _table_arn(region: str, account: str, table: str) -> str:
    return (
        table if table.startswith("arn:") else f"arn:aws:dynamodb:{region}:{account}:table/{table}"
    )


def _bus_arn(region: str, account: str, bus: str) -> str:
    return bus if bus.startswith("arn:") else f"arn:aws:events:{region}:{account}:event-bus/{bus}"


def _dynamodb_checks(
    name: str, body: dict[str, Any], region: str, account: str
) -> list[tuple[str, str]]:
    if name == "TransactWriteItems":
        checks = []
        for item in body.get("TransactItems", []):
            for kind, action in _TRANSACT_WRITE_ACTIONS.items():
                if kind in item:
                    table = _table_arn(region, account, str(item[kind].get("TableName", "")))
                    checks.append((f"dynamodb:{action}", table))
        return checks
    if name == "TransactGetItems":
        return [
            ("dynamodb:GetItem", _table_arn(region, account, str(item["Get"].get("TableName"))))
            for item in body.get("TransactItems", [])
            if "Get" in item
        ]
    if name in ("BatchGetItem", "BatchWriteItem"):
        return [
            (f"dynamodb:{name}", _table_arn(region, account, str(table)))
            for table in body.get("RequestItems", {})
        ]
    named = body.get("TableName")
    if not isinstance(named, str):
        return [(f"dynamodb:{name}", "*")]
    arn = _table_arn(region, account, named)
    if isinstance(body.get("IndexName"), str):
        arn = f"{arn}/index/{body['IndexName']}"
    return [(f"dynamodb:{name}", arn)]


def request_checks(
    action: str, resource: str, body: bytes, *, region: str, account: str
) -> list[tuple[str, str]]:
    """The (action, resource) pairs AWS would authorize for one request."""
    service, _, name = action.partition(":")
    if service in _IAM_PREFIX:
        # moto names the action by the request's signing name, IAM by the service prefix.
        service = _IAM_PREFIX[service]
        action = f"{service}:{name}"
    if service == "sqs" and name.endswith("Batch"):
        return [(f"sqs:{name.removesuffix('Batch')}", resource)]
    if service not in ("dynamodb", "events"):
        return [(action, resource)]
    try:
        parsed = json.loads(body or b"{}")
    except ValueError:
        return [(action, resource)]
    if not isinstance(parsed, dict):
        return [(action, resource)]
    if service == "dynamodb":
        return _dynamodb_checks(name, parsed, region, account) or [(action, resource)]
    if name == "PutEvents":
        buses = {str(entry.get("EventBusName") or "default") for entry in parsed.get("Entries", [])}
        return [(action, _bus_arn(region, account, bus)) for bus in sorted(buses)] or [
            (action, resource)
        ]
    return [(action, resource)]


def _install_request_checks() -> None:
    from moto.iam.access_control import IAMRequestBase

    original: Callable[[Any, str], None] = IAMRequestBase.check_action_permitted
    if getattr(original, "agentq_checks", False):
        return

    def check_action_permitted(self: Any, resource: str) -> None:
        action = self._action
        checks = request_checks(
            action, resource, self._body, region=self._region, account=self.account_id
        )
        try:
            for checked_action, checked_resource in checks:
                self._action = checked_action
                original(self, checked_resource)
        finally:
            self._action = action

    check_action_permitted.agentq_checks = True  # type: ignore[attr-defined]
    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]


def _create_operator(access_key_id: str, secret_access_key: str) -> None:
    from moto.iam.models import iam_backends

    backend = iam_backends[ACCOUNT_ID]["aws"]
    user = backend.create_user("us-east-1", OPERATOR_USER)
    backend.put_user_policy(OPERATOR_USER, "everything", json.dumps(ADMIN_POLICY))
    key = user.create_access_key(prefix="AKIA")
    # The stack's fixed key, so every existing caller is the operator without new config.
    key.access_key_id = access_key_id
    key.secret_access_key = secret_access_key


def enforce_iam(*, operator_key: str, operator_secret: str) -> None:
    """From now on every request must be signed by an IAM user and allowed by its policies."""
    from moto import settings

    _install_request_checks()
    _create_operator(operator_key, operator_secret)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # type: ignore[assignment]
