"""infra.secrets_ready against moto: the stage's Anthropic key found through the secrets
stack's output, refused while it holds the placeholder, accepted once set; each
outcome one line that shows the region and what to do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from agentq.resources import SECRET_PLACEHOLDER, ResourceNames
from infra.secrets_ready import (
    ANTHROPIC_KEY_OUTPUT,
    EXIT_NOT_READY,
    EXIT_READY,
    check,
)

REGION = "eu-central-1"
NAMES = ResourceNames(stage="dev")


@pytest.fixture(name="aws")
def fixture_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        session = boto3.session.Session(region_name=REGION)
        yield {
            "cloudformation": session.client("cloudformation"),
            "secrets": session.client("secretsmanager"),
        }


def _deploy_secrets_stack(aws: dict[str, Any]) -> str:
    arn: str = aws["secrets"].create_secret(
        Name="generated-name-x1", SecretString=SECRET_PLACEHOLDER
    )["ARN"]
    template = {
        "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {ANTHROPIC_KEY_OUTPUT: {"Value": arn}},
    }
    aws["cloudformation"].create_stack(
        StackName=f"{NAMES.prefix}-secrets", TemplateBody=json.dumps(template)
    )
    return arn


def test_secrets_ready_names_the_stack_to_deploy_when_it_is_missing(aws: dict[str, Any]) -> None:
    code, line = check(NAMES, region=REGION, **aws)
    assert code == EXIT_NOT_READY
    assert f"region {REGION}" in line and "npx cdk deploy agentq-dev-secrets -c stage=dev" in line


def test_secrets_ready_refuses_the_placeholder_then_accepts_the_key(aws: dict[str, Any]) -> None:
    arn = _deploy_secrets_stack(aws)
    code, line = check(NAMES, region=REGION, **aws)
    assert code == EXIT_NOT_READY
    assert f"--region {REGION} --secret-id {arn}" in line and "put-secret-value" in line
    aws["secrets"].put_secret_value(SecretId=arn, SecretString="sk-ant-example-value")
    code, line = check(NAMES, region=REGION, **aws)
    assert code == EXIT_READY and "is set" in line
    assert "sk-ant" not in line  # the value is never shown
