"""The producer API's role reads principal-to-tenant mappings; its Lambda gets the
tenancy settings of its stage."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aws_cdk.assertions import Match, Template
from infra_synth import SynthesizedStage, synthesized

from agentq.config import env_name
from agentq.resources import PRINCIPAL_PK_PREFIX
from infra.stacks.worker import WorkerStack
from infra.stages import StageError

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStage:
    return synthesized("dev", tmp_path_factory)


def test_the_producer_api_role_reads_principal_mappings_from_the_events_table(
    dev: SynthesizedStage,
) -> None:
    template = Template.from_stack(dev.stacks.producer_api)
    table = dev.stacks.infrastructure.events_table
    exported = dev.stacks.producer_api.resolve(
        dev.stacks.infrastructure.export_value(table.table_arn)
    )
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "Roles": [{"Ref": Match.string_like_regexp("ProducerApi")}],
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Sid": "ReadPrincipalTenantMappings",
                            "Effect": "Allow",
                            "Action": "dynamodb:GetItem",
                            "Resource": exported,
                            # Mappings only, never a tenant's limit or another's task.
                            "Condition": {
                                "ForAllValues:StringLike": {
                                    "dynamodb:LeadingKeys": [f"{PRINCIPAL_PK_PREFIX}*"]
                                }
                            },
                        }
                    ]
                )
            },
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "lambdas.producer_api.handler",
            "Environment": {
                "Variables": Match.object_like(
                    {env_name("api_account_tenant"): "false", env_name("api_tenant_cache_s"): "30"}
                )
            },
        },
    )


def test_a_stage_passes_its_tenant_limit_to_the_workers_and_refuses_one_out_of_range(
    dev: SynthesizedStage,
) -> None:
    settings = dev.settings
    core = dev.stacks.infrastructure
    unset = WorkerStack.runtime_environment(settings, core)
    assert env_name("tenant_concurrency_limit") not in unset  # the worker's default (0)
    limited = replace(settings, worker=replace(settings.worker, tenant_concurrency_limit=5))
    assert (
        WorkerStack.runtime_environment(limited, core)[env_name("tenant_concurrency_limit")] == "5"
    )
    with pytest.raises(StageError, match="tenant_concurrency_limit"):
        replace(settings.worker, tenant_concurrency_limit=1001).check()
