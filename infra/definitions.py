"""DefinitionsLoader: the stage's task definitions, loaded by `cdk deploy` itself.

The definition directories the stage names (`StageSettings.definitions`) are validated
at synth (a bad file fails `cdk synth`/`cdk deploy` naming it, before anything is
uploaded), staged as one bundle (agentq.definitions.bundle) and shipped as an S3 asset.
A custom resource whose properties carry the asset's location and hash runs
lambdas/definitions_loader.py through CDK's provider framework: any change of a
definition changes the hash, hence the resource, hence an Update that syncs the table.

Least privilege: the loader's role may scan, put and delete items of the definitions
table and read the one bundle object, nothing else; the framework's role may only
invoke the loader (and look it up, to wait for it to be ready) and write its own logs.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct

from agentq.definitions import DEFINITION_SUFFIXES
from agentq.definitions.bundle import stage_bundle
from agentq.definitions.sync import DefinitionSource, load_sources
from agentq.resources import DEFINITIONS_TABLE
from infra.assets import REPO_ROOT, build_cache_dir
from infra.function import AgentqFunction
from infra.nag import acknowledge
from infra.policies import table_statement
from infra.stages import StageSettings

RESOURCE_TYPE = "Custom::AgentqDefinitions"
# The loader stops itself 15 s before this (lambdas.definitions_loader.SAFETY_MARGIN_S).
LOADER_TIMEOUT = Duration.minutes(5)
# How long CloudFormation waits for an answer if the framework itself never sends one
# (its own Lambda runs at most 15 minutes); the default would be an hour.
SERVICE_TIMEOUT = Duration.minutes(20)


def definition_sources(
    settings: StageSettings, repo_root: Path = REPO_ROOT
) -> list[DefinitionSource]:
    """The stage's definition directories, each named as the stage names it."""
    # An absolute directory stays as it is: `repo_root / directory` is then `directory`.
    return [DefinitionSource(repo_root / d, str(d)) for d in settings.definitions]


def staged_bundle(sources: Sequence[DefinitionSource], repo_root: Path = REPO_ROOT) -> Path:
    """The bundle directory for these sources, staged once per content under cdk.out."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(f"\0dir\0{source.label}\0".encode())
        for path in sorted(source.directory.glob("*")):
            if path.is_file() and path.suffix in DEFINITION_SUFFIXES:
                digest.update(f"\0file\0{path.name}\0".encode() + path.read_bytes())
    cache = build_cache_dir(repo_root).parent / ".definitions-bundle"
    target = cache / digest.hexdigest()[:20]
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed: a parallel synth never sees half a bundle.
    scratch = Path(tempfile.mkdtemp(prefix="bundle-", dir=cache))
    try:
        stage_bundle(sources, scratch / "bundle")
        (scratch / "bundle").rename(target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


class DefinitionsLoader(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        table: dynamodb.ITable,
        code: lambda_.Code,
        repo_root: Path = REPO_ROOT,
    ) -> None:
        super().__init__(scope, construct_id)
        sources = definition_sources(settings, repo_root)
        self.names = sorted(load_sources(sources))  # validated here: a bad file fails synth
        self.bundle = s3_assets.Asset(self, "Bundle", path=str(staged_bundle(sources, repo_root)))
        self.handler = AgentqFunction(
            self,
            "Loader",
            settings=settings,
            code=code,
            handler="lambdas.definitions_loader.handler",
            description="Loads the stage's task definitions into their table on deploy",
            environment={},
            statements=[
                # Scan to write only what changed; no Query/UpdateItem, no other table.
                table_statement(table, DEFINITIONS_TABLE, ["Scan", "PutItem", "DeleteItem"]),
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[self.bundle.bucket.arn_for_objects(self.bundle.s3_object_key)],
                ),
            ],
            timeout=LOADER_TIMEOUT,
        )
        self.provider = self._provider(settings)
        self.resource = cdk.CustomResource(
            self,
            "Definitions",
            service_token=self.provider.service_token,
            resource_type=RESOURCE_TYPE,
            service_timeout=SERVICE_TIMEOUT,
            properties={
                "TableName": table.table_name,
                "BundleBucket": self.bundle.s3_bucket_name,
                "BundleKey": self.bundle.s3_object_key,
                "BundleHash": self.bundle.asset_hash,
                "Definitions": self.names,
            },
        )

    def _provider(self, settings: StageSettings) -> cr.Provider:
        # The framework's own role and log group, so neither gets CDK's defaults (the
        # AWSLambdaBasicExecutionRole managed policy, a log group kept forever).
        log_group = logs.LogGroup(
            self,
            "ProviderLogs",
            retention=settings.log_retention,
            removal_policy=settings.removal_policy,
        )
        role = iam.Role(
            self,
            "ProviderRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{settings.names.prefix} definitions loader's provider framework",
        )
        log_group.grant_write(role)
        self.provider_role = role
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.handler.function,
            framework_on_event_role=role,
            log_group=log_group,
        )
        # As for AgentqFunction: the GetAtt already orders the function after its role;
        # cfn-lint (W3005) flags the duplicate, so depend on the policy alone.
        framework = provider.node.find_child("framework-onEvent").node.default_child
        policy = role.node.find_child("DefaultPolicy").node.default_child
        assert isinstance(framework, cdk.CfnResource) and isinstance(policy, cdk.CfnElement)
        framework.add_override("DependsOn", [cdk.Stack.of(self).get_logical_id(policy)])
        acknowledge(
            role,
            "IAM5",
            "The provider framework may invoke the definitions loader's versions "
            "(ARN:*), which CDK grants beside the function itself; nothing else",
            applies_to=f"Resource::<{self._function_logical_id()}.Arn>:*",
        )
        return provider

    def _function_logical_id(self) -> str:
        resource = self.handler.function.node.default_child
        assert isinstance(resource, cdk.CfnElement)
        return cdk.Stack.of(self).get_logical_id(resource)
