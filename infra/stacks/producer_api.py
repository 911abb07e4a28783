"""The producer API: API Gateway with IAM (SigV4) auth in front of one Lambda.

Routing happens inside `lambdas.producer_api` (a `{proxy+}` resource), so adding a
route is a code change, not an infrastructure change; every method still requires
IAM auth, and access logs go to a log group with the stage's retention.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from agentq.config import env_name
from agentq.resources import (
    ARTIFACTS_PREFIX,
    DEFINITIONS_TABLE,
    EVENT_OVERFLOW_PREFIX,
    PRINCIPAL_PK_PREFIX,
)
from infra.function import AgentqFunction
from infra.nag import acknowledge
from infra.policies import grant_objects, leading_keys, table_statement
from infra.stacks.infrastructure import InfrastructureStack
from infra.stages import StageSettings


class ProducerApiStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StageSettings,
        core: InfrastructureStack,
        code: lambda_.Code,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        admins = ",".join(settings.api_definition_admins)  # who may change definitions
        self.handler = AgentqFunction(
            self,
            "ProducerApi",
            settings=settings,
            code=code,
            handler="lambdas.producer_api.handler",
            description="Producer API: submit tasks and jobs, read them, manage definitions",
            environment={
                **core.runtime_environment(
                    "queue_url",
                    "queue_urls",
                    "table_name",
                    "definitions_table",
                    "bus_name",
                    "bucket",
                ),
                env_name("api_account_tenant"): str(settings.api_account_tenant).lower(),
                env_name("api_tenant_cache_s"): str(settings.api_tenant_cache_s),
                **({env_name("api_definition_admins_list"): admins} if admins else {}),
            },
            statements=[
                *core.client_statements(),
                # Producers manage definitions as well as reading them.
                table_statement(
                    core.definitions_table, DEFINITIONS_TABLE, ["PutItem", "DeleteItem", "Scan"]
                ),
                # The caller's tenant: its principal's mapping item (agentq.principals).
                # A statement of its own, so narrowing the client's grant cannot take it
                # away; the Sid keeps policy minimization from folding it in.
                iam.PolicyStatement(
                    sid="ReadPrincipalTenantMappings",
                    actions=["dynamodb:GetItem"],
                    resources=[core.events_table.table_arn],
                    conditions=leading_keys(PRINCIPAL_PK_PREFIX),
                ),
            ],
        )
        # Task results for readers; oversized events overflow to S3.
        grant_objects(self.handler.role, core.bucket, [ARTIFACTS_PREFIX], ["GetObject"])
        grant_objects(
            self.handler.role, core.bucket, [EVENT_OVERFLOW_PREFIX], ["PutObject"], "Overflow"
        )
        access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=settings.log_retention,
            removal_policy=settings.removal_policy,
        )
        self.api = apigateway.LambdaRestApi(
            self,
            "Api",
            rest_api_name=f"{settings.names.prefix}-producer-api",
            handler=self.handler.function,
            proxy=True,
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=cdk.RemovalPolicy.RETAIN,
            default_method_options=apigateway.MethodOptions(
                authorization_type=apigateway.AuthorizationType.IAM
            ),
            deploy_options=apigateway.StageOptions(
                stage_name=settings.name,
                access_log_destination=apigateway.LogGroupLogDestination(access_logs),
                access_log_format=apigateway.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
                logging_level=apigateway.MethodLoggingLevel.ERROR,
                tracing_enabled=True,
                throttling_rate_limit=settings.api_rate_limit,
                throttling_burst_limit=settings.api_burst_limit,
            ),
        )
        self.api.add_request_validator(
            "Validator", validate_request_parameters=True, validate_request_body=True
        )
        acknowledge(
            self.api,
            "APIG3",
            "Every method requires SigV4 (IAM) auth, so unsigned traffic never reaches "
            "the Lambda; a WAF web ACL is an account-level choice for public exposure",
        )
        acknowledge(
            self.api,
            "COG4",
            "Producers are AWS principals (services, CI, operators) authorised by IAM "
            "policies on execute-api, not end users with Cognito identities",
        )
        acknowledge(
            self.api,
            "IAM4",
            "API Gateway's account-level CloudWatch role uses AWS's "
            "AmazonAPIGatewayPushToCloudWatchLogs policy, the documented way to enable logs",
            applies_to="Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs",
        )
        self.functions = {"producer-api": self.handler.function}
