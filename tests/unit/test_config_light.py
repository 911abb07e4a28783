"""The settings read without the model (agentq.config.light) are the model's own.

`Settings` documents them (docs/configuration.md is generated from it); the light reader
must read the same variable, fall back to the same default, allow the same range and
refuse with the same words, for any value a variable may hold.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentq.config import Settings, env_name
from agentq.config.fields import _base, _bounds
from agentq.config.light import CHILD_FIELDS, STAGE_VARIABLE, ChildSettings, IntVar, TextVar
from agentq.errors import ConfigError


def _read_by_model(attribute: str, raw: str) -> Any:
    env = {"AWS_REGION": "eu-west-1", env_name(attribute): raw}
    try:
        return getattr(Settings.from_env(env), attribute)
    except ConfigError as exc:
        return (exc.variable, exc.problem)


def _read_light(attribute: str, raw: str) -> Any:
    try:
        return getattr(ChildSettings.from_env({env_name(attribute): raw}), attribute)
    except ConfigError as exc:
        return (exc.variable, exc.problem)


def test_the_child_reads_exactly_the_settings_documented_for_it() -> None:
    for_child = set()
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        if "child" in str(extra["readers"]).split(", "):
            for_child.add(name)
    assert set(CHILD_FIELDS) == for_child


def test_each_light_field_has_its_model_field_variable_default_and_range() -> None:
    for attribute, light in CHILD_FIELDS.items():
        field = Settings.model_fields[attribute]
        assert light.env == field.validation_alias, attribute
        assert light.default == field.default, attribute
        bounds = _bounds(field)
        if isinstance(light, IntVar):
            assert _base(field.annotation) is int
            assert (light.ge, light.le) == (bounds["ge"], bounds["le"]), attribute
        else:
            assert isinstance(light, TextVar)
            assert _base(field.annotation) is str and "pattern" not in bounds
            assert (light.min_length, light.max_length) == (
                bounds["min_length"], bounds["max_length"],
            ), attribute  # fmt: skip


def test_unset_variables_give_the_model_defaults() -> None:
    child, model = ChildSettings.from_env({}), Settings.from_env({"AWS_REGION": "eu-west-1"})
    assert (child.model, child.step_timeout_ms) == (model.model, model.step_timeout_ms)


def test_the_stage_variable_is_the_model_one() -> None:
    assert env_name("stage") == STAGE_VARIABLE


SPACE = st.sampled_from(["", " ", "\t", "\n", " \r\n"])
DIGITS = st.from_regex(r"\A[0-9_]{1,12}\Z")
NUMBERISH = st.builds(
    lambda before, sign, digits, fraction, after: before + sign + digits + fraction + after,
    SPACE, st.sampled_from(["", "+", "-"]), DIGITS | st.just("0" * 30 + "7"),
    st.sampled_from(["", ".0", ".000", ".5", ".", "e3", ".0_0"]), SPACE,
)  # fmt: skip
RAW = st.one_of(
    NUMBERISH,
    st.integers(-10, 100_000_000).map(str),
    st.text(max_size=12),
    st.text(min_size=250, max_size=260),
)


@settings(max_examples=500, deadline=None, database=None)
@given(raw=RAW, attribute=st.sampled_from(sorted(CHILD_FIELDS)))
# Found by this test: pydantic drops a leading run of zeros and underscores.
@example(raw="0__1", attribute="step_timeout_ms")
@example(raw="0_1__2", attribute="step_timeout_ms")
def test_the_light_reader_reads_any_value_as_the_model_does(raw: str, attribute: str) -> None:
    assert _read_light(attribute, raw) == _read_by_model(attribute, raw)
