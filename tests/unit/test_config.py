from __future__ import annotations

import pathlib

import pytest

from agentq.config import Settings, reference_table
from agentq.errors import ConfigError

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_defaults_and_parsing() -> None:
    settings = Settings.from_env(
        {"MAX_CONCURRENT_CLAUDE": "7", "DELETE_FILES_AFTER_UPLOAD": "no", "SQS_QUEUE_URL": "u"}
    )
    assert settings.max_concurrent == 7
    assert settings.delete_files_after_upload is False
    assert settings.queue_url == "u"
    assert settings.extension_amount_s == 30
    assert settings.lease_seconds == 45


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MAX_CONCURRENT_CLAUDE": "many"}, "MAX_CONCURRENT_CLAUDE"),
        ({"MAX_CONCURRENT_CLAUDE": "0"}, "MAX_CONCURRENT_CLAUDE"),
        ({"AGENTQ_LOCAL": "maybe"}, "AGENTQ_LOCAL"),
        ({"VISIBILITY_EXTENSION_INTERVAL": "40000"}, "VISIBILITY_EXTENSION_INTERVAL"),
        ({"WARM_AGENT": "sometimes"}, "WARM_AGENT"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == variable
    assert variable in str(caught.value)


def test_enumerated_settings_take_only_their_values() -> None:
    assert Settings.from_env({}).warm_agent == "recent"
    assert Settings.from_env({"WARM_AGENT": " always "}).warm_agent == "always"
    with pytest.raises(ConfigError, match="expected one of recent, always, never"):
        Settings.from_env({"WARM_AGENT": "Always"})


def test_required_resource_names_have_no_silent_default() -> None:
    settings = Settings.from_env({})
    with pytest.raises(ConfigError) as caught:
        settings.require("queue_url", "table_name")
    assert caught.value.variable == "SQS_QUEUE_URL"
    assert "DYNAMODB_EVENTS_TABLE_NAME" in str(caught.value)


def test_secrets_stay_out_of_repr() -> None:
    settings = Settings.from_env({"SLACK_BOT_TOKEN": "xoxb-very-secret"})
    assert "xoxb-very-secret" not in repr(settings)
    assert settings.slack_token == "xoxb-very-secret"


def test_docs_table_is_current() -> None:
    assert reference_table() in DOCS.read_text(), (
        "docs/configuration.md is stale: regenerate with `python -m agentq.config`"
    )
