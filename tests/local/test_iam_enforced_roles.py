"""Least privilege, proven for the roles only AWS services assume: the definitions
loader (its handler run as CloudFormation drives it, signing with exactly its
synthesized statements on moto with IAM enforced), and the loader's provider framework
and the worker's ECS execution role (each of their named operations evaluated against
their synthesized statements with agentq.local.iam_policy, since the local stack has no
Lambda or ECS service to make the calls).

For each role, dropping any one statement breaks a named operation: no grant is unused.
"""

from __future__ import annotations

import io
import json
import re
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from agentq.definitions import DefinitionsTable, load_directory
from agentq.definitions.bundle import stage_bundle
from agentq.definitions.sync import DefinitionSource
from agentq.local.aws import (
    LOCAL_CREDENTIALS,
    LOCAL_REGION,
    LocalResources,
    MotoServer,
    local_session_clients,
    provision,
)
from agentq.local.iam import (
    UNRESOLVED,
    Statement,
    create_component_users,
    local_statements,
    synthesized_policies,
)
from agentq.local.iam_policy import Decision, decide
from agentq.local.lambda_host import local_context
from agentq.local.moto_iam import ACCOUNT_ID
from agentq.resources import ResourceNames
from lambdas import _common, definitions_loader

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "definitions" / "samples"
# The account's CDK bootstrap resources (the default synthesizer's qualifier).
ASSETS_BUCKET = "cdk-hnb659fds-assets-${AWS::AccountId}-${AWS::Region}"
IMAGES_REPOSITORY = (
    "arn:aws:ecr:${AWS::Region}:${AWS::AccountId}:repository/"
    "cdk-hnb659fds-container-assets-${AWS::AccountId}-${AWS::Region}"
)
Operation = tuple[str, str]  # (action, resource)


@pytest.fixture(scope="module")
def policies() -> dict[str, list[Statement]]:
    return synthesized_policies()


def _allowed(statements: list[Statement], operation: Operation) -> bool:
    action, resource = operation
    document = {"Statement": statements}
    return decide([document], action, resource, {}) is Decision.ALLOW


def _unresolved(statements: list[Statement], construct: str) -> str:
    """The local stand-in ARN of a resource the local stack lacks, named by its
    construct's path (its logical id but the hash)."""
    pattern = re.compile(re.escape(f"{UNRESOLVED}:") + r"[a-z0-9-]+/" + construct
                         + r"[0-9A-F]{8}(?![A-Za-z0-9])")  # fmt: skip
    found = {m.group(0) for m in pattern.finditer(json.dumps(statements))}
    assert len(found) == 1, f"{construct}: {found}"
    return found.pop()


def _every_statement_is_needed(
    role: str, statements: list[Statement], operations: dict[str, Operation]
) -> None:
    """Each named operation is allowed, and each statement's removal denies one."""
    refused = [name for name, op in operations.items() if not _allowed(statements, op)]
    assert refused == [], f"{role} may not: {refused}"
    for index, statement in enumerate(statements):
        rest = statements[:index] + statements[index + 1 :]
        broken = [name for name, op in operations.items() if not _allowed(rest, op)]
        assert broken, f"{role}: nothing needs {json.dumps(statement)}"


# -- the definitions loader, run -------------------------------------------------------------
@pytest.fixture(scope="module")
def enforced() -> Iterator[tuple[MotoServer, LocalResources]]:
    with MotoServer(iam=True) as server:
        clients = local_session_clients(server.url)
        yield server, provision(clients, ResourceNames(stage="iamroles"), endpoint_url=server.url)


def _zip(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


def _bundle_object(statements: list[Statement]) -> tuple[str, str]:
    """The bundle the custom resource names: the CDK assets bucket's `<hash>.zip`."""
    objects = [s for s in statements if "s3:GetObject" in json.dumps(s.get("Action"))]
    (statement,) = objects
    (arn,) = (
        statement["Resource"]
        if isinstance(statement["Resource"], list)
        else [statement["Resource"]]
    )
    bucket, _, key = str(arn).removeprefix("arn:aws:s3:::").partition("/")
    assert re.fullmatch(r"[0-9a-f]{64}\.zip", key), key
    return bucket, key


class LoaderRun:
    """CloudFormation's Create, Update and Delete of the definitions resource, the
    handler signing as a user holding the given statements."""

    def __init__(self, server: MotoServer, resources: LocalResources, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
        self.server, self.resources, self.tmp = server, resources, tmp_path
        self.monkeypatch = monkeypatch
        self.operator = local_session_clients(server.url)

    def publish(self, synthesized: list[Statement]) -> dict[str, Any]:
        """What the CDK asset publisher does: the bundle, at the key the role names."""
        local = local_statements(synthesized, self.resources, region=LOCAL_REGION,
                                 account=ACCOUNT_ID)  # fmt: skip
        bucket, key = _bundle_object(local)
        s3 = self.operator["s3"]
        try:
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={
                "LocationConstraint": LOCAL_REGION})  # fmt: skip
        except ClientError as error:
            if error.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                raise
        staged = self.tmp / uuid.uuid4().hex
        stage_bundle([DefinitionSource(SAMPLES, "definitions/samples")], staged)
        s3.put_object(Bucket=bucket, Key=key, Body=_zip(staged))
        return {
            "ServiceToken": "arn:aws:lambda:eu-west-1:000000000000:function:provider",
            "TableName": self.resources.definitions_table,
            "BundleBucket": bucket,
            "BundleKey": key,
            "BundleHash": key.removesuffix(".zip"),
            "Definitions": sorted(load_directory(SAMPLES)),
        }

    def run(self, synthesized: list[Statement], *, without: Statement | None = None) -> None:
        """Create, an Update that retires a name the previous deployment shipped, Delete,
        signing with the role's statements (all but `without`)."""
        properties = self.publish(synthesized)
        signing = [s for s in synthesized if s is not without]
        name = f"loader-{uuid.uuid4().hex[:8]}"
        iam = boto3.client("iam", endpoint_url=self.server.url, region_name=LOCAL_REGION,
                           aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        (user,) = create_component_users(iam, self.resources, {name: signing},
                                         region=LOCAL_REGION, account=ACCOUNT_ID).values()  # fmt: skip
        for key, value in {**self.resources.env(), **user.env(),
                           "AWS_ENDPOINT_URL": self.server.url}.items():  # fmt: skip
            self.monkeypatch.setenv(key, value)
        self.monkeypatch.setattr(_common, "_cached", {})  # a cold container of this role
        retired = "retired-by-this-deploy"
        ddb, table_name = self.operator["dynamodb"], self.resources.definitions_table
        context: Any = local_context("definitions-loader")
        base = {"ServiceToken": properties["ServiceToken"], "RequestId": uuid.uuid4().hex,
                "StackId": "arn:aws:cloudformation:eu-west-1:000000000000:stack/agentq/1",
                "LogicalResourceId": "DefinitionsLoaderDefinitions",
                "ResponseURL": "https://cloudformation-custom-resource-response.example/",
                "ResourceType": "Custom::AgentqDefinitions"}  # fmt: skip
        physical = definitions_loader.physical_id(self.resources.definitions_table)
        definitions_loader.handler({**base, "RequestType": "Create",
                                    "ResourceProperties": properties}, context)  # fmt: skip
        # A definition the previous deployment shipped, which this one no longer does.
        shipped = ddb.get_item(TableName=table_name,
                               Key={"name": {"S": properties["Definitions"][0]}})["Item"]  # fmt: skip
        ddb.put_item(TableName=table_name, Item={**shipped, "name": {"S": retired}})
        old = {**properties, "Definitions": [*properties["Definitions"], retired]}
        definitions_loader.handler({**base, "RequestType": "Update", "PhysicalResourceId": physical,
                                    "ResourceProperties": properties,
                                    "OldResourceProperties": old}, context)  # fmt: skip
        definitions_loader.handler({**base, "RequestType": "Delete", "PhysicalResourceId": physical,
                                    "ResourceProperties": properties}, context)  # fmt: skip
        stored = {d.name for d in DefinitionsTable(ddb, table_name).all()}
        assert stored == set(properties["Definitions"]), "the retired definition was deleted"


def test_iam_enforced_the_definitions_loader_runs_with_its_statements_alone(
    enforced: tuple[MotoServer, LocalResources], policies: dict[str, list[Statement]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server, resources = enforced
    LoaderRun(server, resources, tmp_path, monkeypatch).run(policies["definitions-loader"])


def test_iam_enforced_the_loader_breaks_without_any_one_of_its_statements(
    enforced: tuple[MotoServer, LocalResources], policies: dict[str, list[Statement]],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server, resources = enforced
    statements = policies["definitions-loader"]
    # The Lambda service writes the function's logs and traces (no local Lambda service):
    # those statements are proven by their named operations; the rest by a run.
    service_made = {"logs:", "xray:"}
    run_made = [s for s in statements if not json.dumps(s["Action"]).strip('["').startswith(
        tuple(service_made))]  # fmt: skip
    assert run_made, statements
    for statement in run_made:
        with pytest.raises(ClientError) as denied:
            LoaderRun(server, resources, tmp_path, monkeypatch).run(statements, without=statement)
        refusal = denied.value
        # S3 answers AccessDenied; moto's IAM check answers DynamoDB with an XML 403.
        assert refusal.response["Error"]["Code"] == "AccessDenied" or (
            "not authorized to perform" in str(refusal)
        ), str(refusal)
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        # The call refused is one of the statement's own actions.
        assert refusal.operation_name in {a.split(":")[1] for a in actions}, statement
    log_group = _unresolved(statements, "DefinitionsLoaderLogs")
    _every_statement_is_needed("definitions-loader", statements, {
        "the loader's Scan": ("dynamodb:Scan", _table(resources, "definitions_table")),
        "the loader's PutItem": ("dynamodb:PutItem", _table(resources, "definitions_table")),
        "the loader's DeleteItem": ("dynamodb:DeleteItem", _table(resources, "definitions_table")),
        "the bundle's GetObject": ("s3:GetObject", _bundle_arn(statements)),
        "Lambda creates the log stream": ("logs:CreateLogStream", log_group),
        "Lambda writes the logs": ("logs:PutLogEvents", log_group),
        "Lambda writes the traces": ("xray:PutTraceSegments", "*"),
        "Lambda writes the telemetry": ("xray:PutTelemetryRecords", "*"),
    })  # fmt: skip


def _table(resources: LocalResources, which: str) -> str:
    return f"arn:aws:dynamodb:${{AWS::Region}}:${{AWS::AccountId}}:table/${{agentq:{which}}}"


def _bundle_arn(statements: list[Statement]) -> str:
    found = re.search(re.escape(f"arn:aws:s3:::{ASSETS_BUCKET}/") + r"[0-9a-f]{64}\.zip",
                      json.dumps(statements))  # fmt: skip
    assert found, "the bundle lies in the account's CDK assets bucket"
    return found.group(0)


# -- the provider framework and the execution role, evaluated ----------------------------------
def test_the_provider_framework_needs_every_statement_it_holds(
    policies: dict[str, list[Statement]],
) -> None:
    statements = policies["provider-framework"]
    loader = _unresolved(statements, "DefinitionsLoaderFunction")
    log_group = _unresolved(statements, "DefinitionsLoaderProviderLogs")
    _every_statement_is_needed("provider-framework", statements, {
        # CDK's framework.onEvent: waits for the function to be Active, then invokes it.
        "onEvent reads the loader's state": ("lambda:GetFunction", loader),
        "onEvent invokes the loader": ("lambda:InvokeFunction", loader),
        "Lambda creates the log stream": ("logs:CreateLogStream", log_group),
        "Lambda writes the logs": ("logs:PutLogEvents", log_group),
    })  # fmt: skip
    assert not _allowed(
        statements,
        (
            "lambda:InvokeFunction",
            _unresolved(
                policies["worker"] + policies["definitions-loader"], "DefinitionsLoaderLogs"
            ),
        ),
    )


def test_the_execution_role_needs_every_statement_it_holds(
    policies: dict[str, list[Statement]],
) -> None:
    """ECS's execution role pulls the image, sends the container's logs and reads the
    Anthropic key's value (docs/least-privilege.md); it never describes the secret."""
    statements = policies["execution-role"]
    log_group = _unresolved(statements, "Logs")
    secret = _unresolved(statements, "ClaudeApiKey")
    operations = {
        "ECS logs in to ECR": ("ecr:GetAuthorizationToken", "*"),
        "ECS checks the image's layers": ("ecr:BatchCheckLayerAvailability", IMAGES_REPOSITORY),
        "ECS fetches the layers": ("ecr:GetDownloadUrlForLayer", IMAGES_REPOSITORY),
        "ECS fetches the image": ("ecr:BatchGetImage", IMAGES_REPOSITORY),
        "awslogs creates the stream": ("logs:CreateLogStream", log_group),
        "awslogs sends the logs": ("logs:PutLogEvents", log_group),
        "ECS injects ANTHROPIC_API_KEY": ("secretsmanager:GetSecretValue", secret),
    }
    _every_statement_is_needed("execution-role", statements, operations)
    granted = {a for s in statements for a in (s["Action"] if isinstance(s["Action"], list)
                                               else [s["Action"]])}  # fmt: skip
    assert granted == {action for action, _ in operations.values()}, "no action beyond these"
