"""What a task child inherits: never a way to the task role, never a stray secret."""

from __future__ import annotations

import pytest

from worker.child.env import child_environment


@pytest.mark.parametrize(
    "name",
    [
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_SECRET_ACCESS_KEY",
        "ECS_CONTAINER_METADATA_URI_V4",
        "AGENTQ_DB_PASSWORD",
        "AGENTQ_SIGNING_KEY",
        "CLAUDE_CODE_GITHUB_TOKEN",
        "LC_SECRET",
        "SLACK_BOT_TOKEN",
    ],
)
def test_credential_and_secret_variables_never_reach_the_child(name: str) -> None:
    assert name not in child_environment({name: "value", "PATH": "/bin"}, home="/h")


def test_the_child_keeps_what_the_cli_needs() -> None:
    needed = ["ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
              "ANTHROPIC_BASE_URL", "AGENTQ_LOCAL", "PATH", "LANG"]  # fmt: skip
    env = child_environment(dict.fromkeys(needed, "v"), home="/h")
    assert set(needed) <= set(env)
    assert env["HOME"] == "/h"
