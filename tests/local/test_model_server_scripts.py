"""The model server's schema-driven value generator, marker grammar, script files and usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from _model_server_common import REPORT_SCHEMA

from agentq.local.model_server import (
    ScriptError,
    compute_usage,
    generate_value,
    load_script,
    parse_directives,
    parse_markers,
)

# --------------------------------------------------------------------------------------------
# Schema-driven value generator
# --------------------------------------------------------------------------------------------

GENERATOR_SCHEMAS: list[dict[str, Any]] = [
    REPORT_SCHEMA,
    {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5},
    {"type": "integer", "minimum": 10, "multipleOf": 7},
    {"type": "number", "minimum": -2.5, "maximum": -2.4},
    {"type": "number", "multipleOf": 0.5, "minimum": 1, "maximum": 2},
    {"type": "string", "minLength": 300},
    {"type": "string", "maxLength": 3},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    {"type": "string", "pattern": "^(foo|bar)_\\d+$"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email"},
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 3},
        "minItems": 4,
        "uniqueItems": True,
    },
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
    {"type": "array", "maxItems": 0},
    {"const": {"fixed": True}},
    {"enum": [None, 3, "x"]},
    {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 50}]},
    {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "integer"}]},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer", "maximum": -5}}, "required": ["b"]},
        ]
    },
    {
        "$defs": {
            "item": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "minItems": 1},
                },
                "required": ["id", "children"],
            },
            "leaf": {"type": "string", "enum": ["x", "y"]},
        },
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 2}
        },
        "required": ["items"],
    },
    {"type": "object", "required": ["only_required"], "additionalProperties": {"type": "integer"}},
    {"type": "object", "minProperties": 2},
    {"properties": {"x": {"minimum": 5}}},
]


@pytest.mark.parametrize("schema", GENERATOR_SCHEMAS, ids=lambda s: json.dumps(s)[:50])
def test_generated_values_are_schema_valid(schema: dict[str, Any]) -> None:
    value = generate_value(schema, "Summarise the quarterly report for ACME")
    jsonschema.Draft202012Validator(schema).validate(value)


def test_generator_is_deterministic_and_mentions_the_prompt() -> None:
    prompt = "Summarise the quarterly report for ACME"
    a = generate_value(REPORT_SCHEMA, prompt)
    assert a == generate_value(REPORT_SCHEMA, prompt)
    assert "quarterly report" in a["summary"]
    assert "ACME" in a["owner"]["name"]
    assert len(a["tags"]) == 2
    other = generate_value(REPORT_SCHEMA, "Triage the failing login tests")
    assert "login" in other["summary"]


def test_generator_rejects_impossible_schema() -> None:
    with pytest.raises(ValueError):
        generate_value(False)


# --------------------------------------------------------------------------------------------
# Grammar and scripts
# --------------------------------------------------------------------------------------------


def test_marker_grammar_parses_every_directive() -> None:
    text = (
        "Do it [[model: key k1; fail 429 x2 retry-after 0.5; fail 529 x1 turn 1 no-retry]] now "
        '[[model: delay 1.5s; stall midstream x1 turn 2; output {"a": "]]; not the end"} x1; '
        'tool Bash {"command": "echo [[x]]"}; tool Read {"file_path": "/tmp/f"}; '
        "text all good here; usage input=10 output=2 cache_read=3 cache_creation=4]] please"
    )
    scn, rest = parse_markers(text)
    assert scn is not None
    assert rest == "Do it  now  please"
    assert scn.key == "k1"
    assert [(f.status, f.times, f.turn, f.retry_after, f.no_retry) for f in scn.failures] == [
        (429, 2, None, 0.5, False),
        (529, 1, 1, None, True),
    ]
    assert [(d.ms, d.turn) for d in scn.delays] == [(1500, None)]
    assert [(s.midstream, s.times, s.turn) for s in scn.stalls] == [(True, 1, 2)]
    assert scn.output == {"a": "]]; not the end"} and scn.output_times == 1
    assert [(t.name, t.input) for t in scn.tools] == [
        ("Bash", {"command": "echo [[x]]"}),
        ("Read", {"file_path": "/tmp/f"}),
    ]
    assert scn.text == "all good here"
    assert scn.usage == {
        "input_tokens": 10,
        "output_tokens": 2,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 4,
    }


def test_marker_without_key_uses_its_text() -> None:
    scn, _ = parse_markers("x [[model:  fail 500   x1 ]]")
    assert scn is not None and scn.key is None and scn.source == "fail 500 x1"
    assert parse_markers("no marker here") == (None, "no marker here")


@pytest.mark.parametrize(
    "bad",
    [
        "[[model: fail]]",
        "[[model: explode 3]]",
        "[[model: output nope]]",
        "[[model: tool Bash]]",
        "[[model: delay soon]]",
        "[[model: usage tokens=3]]",
        "[[model: fail 429 x2",
        '[[model: output {"a": ]]',
    ],
)
def test_marker_grammar_errors(bad: str) -> None:
    with pytest.raises(ScriptError):
        parse_markers(bad)


def test_script_files_json_and_yaml(tmp_path: Path) -> None:
    rules: list[dict[str, Any]] = [
        {"match": "report", "do": "fail 429 x1", "output": {"x": 1}},
        {
            "key": "tools",
            "tools": [{"name": "Bash", "input": {"command": "ls"}}],
            "fail": {"status": 500, "times": 2},
            "usage": {"input_tokens": 5},
        },
    ]
    json_path = tmp_path / "s.json"
    json_path.write_text(json.dumps({"rules": rules}))
    yaml_path = tmp_path / "s.yaml"
    yaml_path.write_text(
        "- match: report\n  do: fail 429 x1\n  output: {x: 1}\n"
        "- key: tools\n  tools: [{name: Bash, input: {command: ls}}]\n"
        "  fail: {status: 500, times: 2}\n  usage: {input_tokens: 5}\n"
    )
    for loaded in (load_script(json_path), load_script(yaml_path), load_script(rules)):
        assert [r.key for r in loaded] == ["report", "tools"]
        assert loaded[0].scenario.failures[0].status == 429
        assert loaded[0].scenario.output == {"x": 1}
        assert loaded[1].match is None and loaded[1].scenario.tools[0].name == "Bash"
        assert loaded[1].scenario.usage == {"input_tokens": 5}
    with pytest.raises(ScriptError):
        load_script([{"bogus": 1}])
    assert parse_directives("fail 401").failures[0].times is None


def test_usage_is_derived_from_request_size() -> None:
    first = compute_usage(4000, 2000, turn=0, output_chars=100)
    assert first == {
        "input_tokens": 500,
        "cache_creation_input_tokens": 500,
        "cache_read_input_tokens": 0,
        "output_tokens": 25,
    }
    later = compute_usage(4000, 2000, turn=1, output_chars=2)
    assert later["cache_read_input_tokens"] == 500 and later["cache_creation_input_tokens"] == 0
    assert later["output_tokens"] == 1
