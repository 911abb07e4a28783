"""definitions-loader: the deployment's custom resource that loads the task definitions.

CloudFormation calls it (through CDK's provider framework, infra/definitions.py) on
every `cdk deploy` whose definitions bundle changed. Properties:

- `TableName`: the stage's task-definitions table.
- `BundleBucket`, `BundleKey`: the bundle asset (agentq.definitions.bundle).
- `BundleHash`: the asset's hash; it is here so any change of a definition is a change
  of the resource, hence an Update.
- `Definitions`: the names the bundle holds. On Update, names the previous deployment
  shipped and this one does not are deleted; names others wrote (`agentq definitions
  put`) are left alone.

Create and Update run the same sync as `agentq definitions sync` (every file validated
before the first write; whole-item puts, so a retry or a rerun converges). A failure is
raised: the framework reports FAILED to CloudFormation with the message, which names the
bad file, and the stack rolls back; a rollback is an Update back to the old bundle, so
the table returns to what the previous deployment shipped. Delete does nothing: the
table keeps its definitions (in prod it is retained with them; in dev it goes with its
stack anyway). The sync stops with `OutOfTime` before the function's own timeout, so even
a throttled run reports a reason instead of being cut off.
"""

from __future__ import annotations

import time
from typing import Any, Final

from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.definitions import DefinitionsTable
from agentq.definitions.bundle import MAX_BUNDLE_BYTES, read_bundle
from agentq.definitions.sync import sync_definitions
from agentq.errors import InvalidInput, shown
from lambdas._common import powertools, runtime, warm_clients

logger, _ = powertools("definitions-loader")

# Time kept back from the function's timeout to report a stop rather than be cut off.
SAFETY_MARGIN_S: Final = 15.0
_PROPERTIES: Final = ("TableName", "BundleBucket", "BundleKey", "BundleHash")


def warm() -> None:
    warm_clients("dynamodb", "s3")


def physical_id(table_name: str) -> str:
    """One id per table: an Update never looks like a replacement to CloudFormation."""
    return f"agentq-definitions:{table_name}"


def _properties(event: dict[str, Any], key: str) -> dict[str, Any]:
    properties = event.get(key) or {}
    if not isinstance(properties, dict):
        raise InvalidInput(key, "must be a mapping")
    return properties


def _names(properties: dict[str, Any]) -> list[str]:
    names = properties.get("Definitions") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidInput("Definitions", "must be a list of names")
    return names


def _bundle(s3: Any, bucket: str, key: str) -> bytes:
    response = s3.get_object(Bucket=bucket, Key=key)
    if int(response.get("ContentLength", 0)) > MAX_BUNDLE_BYTES:
        raise InvalidInput("definitions bundle", f"larger than {MAX_BUNDLE_BYTES} bytes")
    body: bytes = response["Body"].read(MAX_BUNDLE_BYTES + 1)
    return body


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    started = time.monotonic()
    request = event.get("RequestType")
    if request == "Delete":
        # Checked first: a Delete must succeed whatever the properties held, or a stack
        # whose Create failed could not roll back. The table keeps its definitions: in
        # prod it is retained, in dev it goes with its stack anyway.
        logger.info("definitions left in place on delete")
        return {"PhysicalResourceId": str(event.get("PhysicalResourceId") or "none")}
    if request not in ("Create", "Update"):
        raise InvalidInput("RequestType", f"unknown request type {shown(request)}")
    properties = _properties(event, "ResourceProperties")
    for key in _PROPERTIES:
        if not isinstance(properties.get(key), str) or not properties[key]:
            raise InvalidInput(key, "is a required property")
    table_name = str(properties["TableName"])
    rt = runtime()
    archive = _bundle(rt.clients.s3, properties["BundleBucket"], properties["BundleKey"])
    wanted = read_bundle(archive)  # everything validated before the first write
    shipped = set(_names(properties))
    if shipped != set(wanted):
        raise InvalidInput("Definitions", "the names do not match the bundle's definitions")
    previous = _names(_properties(event, "OldResourceProperties")) if request == "Update" else []
    deadline = started + context.get_remaining_time_in_millis() / 1000 - SAFETY_MARGIN_S
    report = sync_definitions(
        DefinitionsTable(rt.clients.dynamodb, table_name),
        wanted,
        remove=sorted(set(previous) - shipped),
        deadline=deadline,
    )
    logger.info(
        "definitions loaded",
        extra={"table": table_name, "bundle": properties["BundleHash"], **report.to_dict()},
    )
    return {
        "PhysicalResourceId": physical_id(table_name),
        # Counts only: Data ends up in the stack's events, where names would be noise.
        "Data": {
            "Added": len(report.added),
            "Updated": len(report.updated),
            "Unchanged": len(report.unchanged),
            "Deleted": len(report.deleted),
        },
    }
