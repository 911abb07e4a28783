"""`python -m infra.secrets_ready --stage NAME`: is the stage's Anthropic key set yet?

`make deploy` runs it between the secrets stack and the rest of the stage: the worker
refuses the placeholder a new secret holds, so deploying it before the key is set would
crash-loop the first task and roll the worker stack back. Reads the secret's ARN from
the secrets stack's output and compares the value with the placeholder (the value is
never printed). Every outcome is one line that shows the region and says what to do.
Read-only and safe to rerun; botocore retries throttled calls.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

from agentq.resources import APP_NAME_DEFAULT, SECRET_PLACEHOLDER, ResourceNames

# The secrets stack's output with the key's ARN (infra/stacks/secrets.py sets it).
ANTHROPIC_KEY_OUTPUT: Final = "ClaudeApiKeySecretArn"
EXIT_READY, EXIT_NOT_READY, EXIT_NO_ACCESS = 0, 1, 2


def check(
    names: ResourceNames, *, region: str, cloudformation: Any, secrets: Any
) -> tuple[int, str]:
    """(exit code, the one line to print) for the stage's Anthropic key."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    stack = f"{names.prefix}-secrets"
    deploy = f"npx cdk deploy {stack} -c stage={names.stage}"
    try:
        described = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        arn = outputs.get(ANTHROPIC_KEY_OUTPUT)
        if arn is None:
            return (
                EXIT_NOT_READY,
                f"{stack} in {region} has no {ANTHROPIC_KEY_OUTPUT} output: run `{deploy}`",
            )
        value = secrets.get_secret_value(SecretId=arn).get("SecretString", "")
    except NoCredentialsError:
        return EXIT_NO_ACCESS, (
            f"no AWS credentials for region {region}: set AWS_PROFILE (or run `aws configure`) "
            f"for the account of stage {names.stage}, then rerun"
        )
    except ClientError as exc:
        if "does not exist" in str(exc):
            return EXIT_NOT_READY, f"stack {stack} is not in region {region}: run `{deploy}` first"
        code = exc.response.get("Error", {}).get("Code", "?")
        return (
            EXIT_NO_ACCESS,
            f"AWS refused {exc.operation_name} in region {region} ({code}): check the role's permissions",
        )
    except BotoCoreError as exc:
        return (
            EXIT_NO_ACCESS,
            f"cannot reach AWS in region {region} ({type(exc).__name__}): check the network and AWS_REGION",
        )
    if not value or value == SECRET_PLACEHOLDER:
        return EXIT_NOT_READY, (
            f"the Anthropic key of stage {names.stage} (region {region}) is still the placeholder: "
            f"run `aws secretsmanager put-secret-value --region {region} --secret-id {arn} "
            '--secret-string "$ANTHROPIC_API_KEY"`, then rerun'
        )
    return EXIT_READY, f"the Anthropic key of stage {names.stage} (region {region}) is set"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.secrets_ready", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stage", required=True)
    parser.add_argument("--app-name", default=APP_NAME_DEFAULT)
    args = parser.parse_args(argv)
    import boto3

    from agentq.config.settings import _fallback_region

    region = os.environ.get("AWS_REGION") or _fallback_region(os.environ)
    session = boto3.session.Session(region_name=region)
    code, line = check(
        ResourceNames(stage=args.stage, app_name=args.app_name),
        region=region,
        cloudformation=session.client("cloudformation"),
        secrets=session.client("secretsmanager"),
    )
    print(f"secrets_ready: {line}", file=sys.stdout if code == EXIT_READY else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
