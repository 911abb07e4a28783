"""The model server's parsers: schema-pattern samples match their pattern; markers parse."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.local.model_server import ScriptError, parse_directives, parse_markers
from agentq.local.model_server.pattern import pattern_sample
from agentq.local.model_server.scenario import MARKER_OPEN
from agentq.local.model_server.values import generate_value

LITERALS = st.sampled_from([*"abcXYZ019_-@.", r"\.", r"\-", r"\\", r"\/", r"\x41", r"\u00e9"])
CATEGORIES = st.sampled_from([r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", "."])
CLASS_ITEMS = st.sampled_from(["a-z", "A-Z", "0-9", "_", "-", r"\d", r"\w", ".", r"\]", "é"])
CLASSES = st.builds(
    lambda negate, items: f"[{'^' if negate else ''}{''.join(items)}]",
    st.booleans(),
    st.lists(CLASS_ITEMS, min_size=1, max_size=4),
)
QUANTIFIERS = st.sampled_from(["", "*", "+", "?", "{2}", "{1,3}", "{2,}", "*?", "+?", "{0,4}?"])


def _pattern(atoms: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    piece = st.builds(lambda a, q: a + q, atoms, QUANTIFIERS)
    sequence = st.lists(piece, min_size=1, max_size=5).map("".join)
    return st.lists(sequence, min_size=1, max_size=3).map("|".join)


ATOMS = st.recursive(
    st.one_of(LITERALS, CATEGORIES, CLASSES),
    lambda inner: st.builds(
        lambda opener, body: f"{opener}{body})",
        st.sampled_from(["(", "(?:", "(?P<g>", "(?<h>"]),
        _pattern(inner),
    ),
    max_leaves=8,
)
PATTERNS = st.builds(
    lambda start, body, end: f"{start}{body}{end}",
    st.sampled_from(["", "^", r"\A"]),
    _pattern(ATOMS),
    st.sampled_from(["", "$", r"\Z", r"\b"]),
)


@given(PATTERNS, st.integers(min_value=0, max_value=2**48))
def test_a_sample_of_the_subset_matches_its_pattern(pattern: str, seed: int) -> None:
    try:
        re.compile(pattern)
    except re.error:
        return  # e.g. a duplicate group name: not a pattern at all
    sample = pattern_sample(pattern, seed)
    if sample is None:
        # The one way the subset can miss: a word boundary next to a sampled non-word
        # character; the schema generator then falls back to its other candidates.
        assert r"\b" in pattern
    else:
        assert re.search(pattern, sample)


@pytest.mark.parametrize(
    ("pattern", "seed", "expected"),
    [
        ("^[A-Z]{3}-[0-9]{4}$", 0, "AAA-0000"),
        (r"^(foo|bar)_\d+$", 1, "bar_7"),
        (r"\w+@\w+\.com", 0, "a@a.com"),
        (r"\x41\u0042", 0, "AB"),
    ],
)
def test_samples_are_deterministic(pattern: str, seed: int, expected: str) -> None:
    assert pattern_sample(pattern, seed) == pattern_sample(pattern, seed) == expected


@pytest.mark.parametrize("pattern", [r"(?=x)y", r"(a)\1", r"(?i)abc", r"[", r"a{,3}b(?!c)"])
def test_syntax_outside_the_subset_gives_no_sample(pattern: str) -> None:
    assert pattern_sample(pattern, 0) is None


@given(st.sampled_from(["^[a-z]{2,5}-[0-9]{3}$", r"^ID_\d{4}$", r"^(red|green|blue)$"]), st.text())
def test_generated_strings_satisfy_the_schema_pattern(pattern: str, prompt: str) -> None:
    value = generate_value({"type": "string", "pattern": pattern}, prompt)
    assert re.search(pattern, value)


# -- the directive grammar ---------------------------------------------------------------

DIRECTIVES = st.sampled_from(
    [
        "key k1",
        "fail 429 x2",
        "fail 500 turn 1 retry-after 1.5 no-retry",
        "stall midstream x1",
        "delay 250ms",
        'output {"a": 1}',
        'tool Bash {"command": "ls"}',
        "text done",
        "usage input=3 output=4",
    ]
)


@given(st.text(max_size=80))
def test_text_without_markers_is_kept_whole(text: str) -> None:
    if MARKER_OPEN in text:
        return
    assert parse_markers(text) == (None, text)


@given(st.text(max_size=40), st.lists(DIRECTIVES, min_size=1, max_size=4), st.text(max_size=40))
def test_a_marker_is_parsed_and_cut_out_wherever_it_stands(
    before: str, directives: list[str], after: str
) -> None:
    if MARKER_OPEN in before + after or MARKER_OPEN[:-1] in before[-8:]:
        return
    scenario, rest = parse_markers(f"{before}[[model: {'; '.join(directives)}]]{after}")
    assert rest == before + after
    expected = parse_directives("; ".join(directives))
    expected.source = "; ".join(directives)
    assert scenario == expected


@given(st.text(max_size=60))
def test_any_marker_body_parses_or_is_a_script_error(body: str) -> None:
    with contextlib.suppress(ScriptError):
        parse_markers(f"{MARKER_OPEN}{body}")


def test_a_resumed_conversation_counts_the_models_turns_and_goes_on_with_the_script() -> None:
    from agentq.local.model_server.request import Request, plan_turn
    from agentq.local.model_server.scenario import CLI_SYNTHETIC_ANSWER

    scenario = parse_directives('tool Bash {"command": "echo 1"}; tool Bash {"command": "echo 2"}')

    def call(n: int) -> list[dict[str, object]]:
        use = {"type": "tool_use", "id": f"toolu_offline_s{n}_x", "name": "Bash", "input": {}}
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}
        return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]

    # What the CLI sends when it resumes a session stopped after the first tool result:
    # the earlier turn, its own closing answer, then the new prompt.
    messages = [
        {"role": "user", "content": "Do it"},
        *call(0),
        {"role": "assistant", "content": [{"type": "text", "text": CLI_SYNTHETIC_ANSWER}]},
        {"role": "user", "content": "Continue from where the conversation stopped."},
    ]
    request = Request.parse({"messages": messages}, raw_size=100)

    assert request.turn == 1
    assert request.prompt == "Do it"
    content, stop = plan_turn(scenario, request, request.prompt, "k")
    assert stop == "tool_use" and content[0]["input"] == {"command": "echo 2"}
