from __future__ import annotations

from typing import Literal, get_origin

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.config import Settings, env_name
from agentq.config import doc as config_doc
from agentq.errors import ConfigError


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
        ({"WAIT_TIME_SECONDS": "21"}, "WAIT_TIME_SECONDS"),
        ({"WAIT_TIME_SECONDS": "-1"}, "WAIT_TIME_SECONDS"),
        (
            {"VISIBILITY_TIMEOUT": "10", "VISIBILITY_EXTENSION_INTERVAL": "10000"},
            "VISIBILITY_EXTENSION_INTERVAL",
        ),
        ({"RETRY_BACKOFF_BASE": "10", "RETRY_BACKOFF_MAX": "5"}, "RETRY_BACKOFF_BASE"),
        ({"LOG_LEVEL": "chatty"}, "LOG_LEVEL"),
        ({"AWS_REGION": "eu west 1"}, "AWS_REGION"),
        ({"S3_BUCKET": "b" * 64}, "S3_BUCKET"),
        ({"RETRY_BACKOFF_MAX": "soon"}, "RETRY_BACKOFF_MAX"),
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


def test_range_errors_say_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"expected an integer from 0 to 20, got '25'"):
        Settings.from_env({"WAIT_TIME_SECONDS": "25"})


def test_a_refused_secret_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"SLACK_BOT_TOKEN": "xoxb-" + "s" * 300})
    assert caught.value.variable == "SLACK_BOT_TOKEN"
    assert "xoxb" not in str(caught.value)


def test_settings_built_in_code_are_the_defaults_plus_what_is_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only from_env reads the environment: code that builds Settings gets what it asks for.
    monkeypatch.setenv("CLAUDE_MODEL", "from-the-environment")
    settings = Settings(step_timeout_ms=42_000)
    assert (settings.step_timeout_ms, settings.model) == (42_000, "claude-sonnet-4-5")
    with pytest.raises(ValueError):
        Settings(no_such_setting=1)  # type: ignore[call-arg]


def test_every_setting_is_bounded_and_documented() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert env_name(name) == field.validation_alias
        bounds = {type(m).__name__ for m in field.metadata}
        enumerated = field.annotation is bool or get_origin(field.annotation) is Literal
        assert enumerated or {"Ge", "Le"} <= bounds or {"MinLen", "MaxLen"} <= bounds, name


INTEGERS = [name for name, field in Settings.model_fields.items() if field.annotation is int]


@given(st.sampled_from(INTEGERS), st.integers(min_value=-(10**9), max_value=10**9))
def test_an_integer_setting_is_taken_exactly_when_in_its_range(name: str, value: int) -> None:
    field = Settings.model_fields[name]
    low, high = (
        next(getattr(m, bound) for m in field.metadata if hasattr(m, bound))
        for bound in ("ge", "le")
    )
    # Relations between settings are kept true by choosing them alongside.
    env = {
        "VISIBILITY_EXTENSION_AMOUNT": "43200",
        "VISIBILITY_TIMEOUT": "43200",
        "VISIBILITY_EXTENSION_INTERVAL": "50",
        env_name(name): f" {value} ",
    }
    # At its maximum the heartbeat interval equals the largest extension: refused as a
    # relation, not a range (checked by its own test).
    related = name == "extension_interval_ms" and value == high
    if low <= value <= high and not (name == "visibility_timeout" and value == 0) and not related:
        assert getattr(Settings.from_env(env), name) == value
    elif not low <= value <= high or related:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env(env)
        assert caught.value.variable == env_name(name)


@given(st.text(max_size=12))
def test_flags_take_only_the_documented_spellings(raw: str) -> None:
    word = raw.strip().lower()
    if word in {"1", "true", "yes", "on"}:
        assert Settings.from_env({"PERSIST_HEARTBEATS": raw}).persist_heartbeats is True
    elif word in {"0", "false", "no", "off", ""}:
        assert Settings.from_env({"PERSIST_HEARTBEATS": raw}).persist_heartbeats is False
    else:
        with pytest.raises(ConfigError, match="PERSIST_HEARTBEATS expected true/false"):
            Settings.from_env({"PERSIST_HEARTBEATS": raw})


def test_docs_table_is_generated_from_the_settings_model() -> None:
    current = config_doc.DOC.read_text(encoding="utf-8")
    assert config_doc.render(current) == current, (
        "docs/configuration.md is stale: regenerate with `python -m agentq.config.doc`"
    )
    assert config_doc.main(["--check"]) == 0
