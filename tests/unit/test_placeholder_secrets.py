"""A secret still holding the stack's placeholder is never used as a credential."""

from __future__ import annotations

from moto import mock_aws

from agentq.alerts.slack import LogNotifier, SlackNotifier, notifier
from agentq.config import Settings
from agentq.local.aws import LOCAL_REGION
from agentq.resources import SECRET_PLACEHOLDER


def test_health_check_logs_instead_of_posting_with_the_placeholder_token() -> None:
    import boto3

    with mock_aws():
        secrets = boto3.client("secretsmanager", region_name=LOCAL_REGION)
        arn = secrets.create_secret(Name="slack", SecretString=SECRET_PLACEHOLDER)["ARN"]
        settings = Settings.from_env(
            {"SLACK_TOKEN_SECRET_ARN": arn, "ALERT_CHANNEL": "#agentq-alerts"}
        )
        sink = notifier(settings, secrets)
        assert isinstance(sink, LogNotifier)
        assert "placeholder" in sink.why
        secrets.put_secret_value(SecretId=arn, SecretString="xoxb-real-looking")
        assert isinstance(notifier(settings, secrets), SlackNotifier)
