"""The stage's worker secret, in a stack of its own that is deployed and filled first.

The worker refuses the placeholder a new secret starts with (worker/secretcheck.py), so
a worker service created in the same deployment as its secret can only crash-loop
until the ECS circuit breaker rolls the whole stack back. Here the secret exists, with
its ARN as a stack output, before the worker stack does: the operator puts the key in
through that output, and `python -m infra.secrets_ready` confirms it before the rest of
the stage deploys (docs/deploy.md, "First deploy").
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from agentq.resources import SECRET_PLACEHOLDER
from infra.nag import acknowledge
from infra.secrets_ready import ANTHROPIC_KEY_OUTPUT
from infra.stages import StageSettings


class SecretsStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: StageSettings, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        prefix = settings.names.prefix
        self.claude_secret = placeholder_secret(
            self,
            "ClaudeApiKey",
            settings,
            description=f"{prefix}: Anthropic API key for the Claude Agent SDK in workers",
            output=ANTHROPIC_KEY_OUTPUT,
            output_description="Put the Anthropic API key here before the worker stack deploys",
            issued_by="The Anthropic API key is issued by Anthropic's console",
        )


def placeholder_secret(
    scope: Construct,
    construct_id: str,
    settings: StageSettings,
    *,
    description: str,
    output: str,
    output_description: str,
    issued_by: str,
) -> secretsmanager.Secret:
    """A secret that starts as the known placeholder (the worker and the health check
    refuse it), its ARN a stack output to put the real value through. CloudFormation
    names it: a fixed name would block a redeploy for the 30 days a deleted secret stays
    scheduled for deletion."""
    secret = secretsmanager.Secret(
        scope,
        construct_id,
        description=description,
        secret_string_value=cdk.SecretValue.unsafe_plain_text(SECRET_PLACEHOLDER),
        removal_policy=settings.removal_policy,
    )
    cdk.CfnOutput(scope, output, value=secret.secret_arn, description=output_description)
    acknowledge(
        secret,
        "SMG4",
        f"{issued_by}; no rotation Lambda can mint a new one, so it is rotated by hand "
        "(docs/operations.md)",
    )
    return secret
