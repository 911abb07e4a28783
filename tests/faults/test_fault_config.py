"""The AGENTQ_FAULTS parser: both forms agree, and anything else is a ConfigError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.errors import ConfigError
from agentq.faults.config import FaultRule, FaultSettings, Kind, parse_spec

_ops = st.one_of(
    st.just("*"),
    st.builds(
        lambda service, op: f"{service}:{op}",
        st.sampled_from(["dynamodb", "sqs", "events", "s3"]),
        st.one_of(st.just("*"), st.from_regex(r"[A-Z][A-Za-z]{1,20}", fullmatch=True)),
    ),
)
_rules = st.builds(
    FaultRule,
    op=_ops,
    kind=st.sampled_from(list(Kind)),
    rate=st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)


@given(st.lists(_rules, min_size=1, max_size=6))
def test_compact_and_json_forms_parse_to_the_same_spec(rules: list[FaultRule]) -> None:
    compact = ";".join(rule.compact() for rule in rules)
    as_json = json.dumps({"rules": [rule.model_dump(mode="json") for rule in rules]})
    assert parse_spec(compact).rules == tuple(rules)
    assert parse_spec(as_json).rules == tuple(rules)


@given(st.text(max_size=80))
def test_arbitrary_text_parses_or_raises_config_error(text: str) -> None:
    try:
        spec = parse_spec(text)
    except ConfigError as exc:
        assert exc.variable == "AGENTQ_FAULTS"
    else:
        assert all(0.0 <= rule.rate <= 1.0 for rule in spec.rules)


@pytest.mark.parametrize(
    "text",
    [
        "dynamodb:UpdateItem=melt@0.1",
        "dynamodb:UpdateItem=throttle@1.5",
        "UpdateItem=throttle@0.1",
        '{"rules": [{"op": "*", "kind": "throttle", "rate": 0.1, "extra": 1}]}',
        '{"rules": [{"op": "*", "kind": "throttle"}]}',
        "{not json",
    ],
)
def test_bad_specs_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_spec(text)


def test_settings_are_off_without_a_spec_and_read_seed_and_log() -> None:
    assert FaultSettings.from_env({}) is None
    assert FaultSettings.from_env({"AGENTQ_FAULTS": "  "}) is None
    settings = FaultSettings.from_env(
        {"AGENTQ_FAULTS": "*=throttle@0.05", "AGENTQ_FAULTS_SEED": "9", "AGENTQ_FAULTS_LOG": "/x"}
    )
    assert settings is not None
    assert (settings.seed, settings.log_path) == (9, "/x")
    assert settings.spec.rules == (FaultRule(op="*", kind=Kind.THROTTLE, rate=0.05),)
    with pytest.raises(ConfigError):
        FaultSettings.from_env({"AGENTQ_FAULTS": "*=throttle@0.05", "AGENTQ_FAULTS_SEED": "x"})
