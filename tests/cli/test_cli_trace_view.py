"""`agentq trace ID` without --json: a worker's trace drawn for a person, whatever its
strings hold, and any other JSON shown as JSON."""

from __future__ import annotations

import io
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from agentq.cli._trace_view import is_worker_trace, print_trace
from agentq.cli.outputs import terminal_safe

HOSTILE = "[bold red]Bash[/] \x1b]0;owned\x07\x1b[2J"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

TRACE: dict[str, Any] = {
    "usage": {
        "input_tokens": 1234,
        "output_tokens": 567,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 89,
    },
    "cost_usd": 0.0123,
    "num_turns": 2,
    "duration_ms": 3210,
    "cache_efficiency_pct": 0.0,
    "result_subtype": "success",
    "attempts": [{"attempt": 1}],
    "turns": [
        {
            "message_id": "m1",
            "attempt": 1,
            "at_ms": 812.5,
            "tools": ["Read", HOSTILE],
            "usage": {"input_tokens": 1234, "output_tokens": 567},
            "error": None,
        },
    ],
    "tool_calls": [
        {
            "id": "t1",
            "name": "Read",
            "attempt": 1,
            "started_ms": 900.0,
            "input_bytes": 42,
            "duration_ms": 12.5,
            "output_bytes": 2048,
            "status": "ok",
        },
        {
            "id": "t2",
            "name": HOSTILE,
            "attempt": 1,
            "started_ms": 950.0,
            "input_bytes": 7,
            "duration_ms": None,
            "output_bytes": None,
            "status": "running",
        },
    ],
    "todos": [{"content": "read the [file]", "state": "completed"}],
}


def drawn(trace: dict[str, Any]) -> str:
    out = io.StringIO()
    print_trace(Console(file=out, width=160, color_system=None), trace, terminal_safe)
    return out.getvalue()


def test_a_worker_trace_reads_as_totals_tokens_turns_tools_and_todos() -> None:
    assert is_worker_trace(TRACE)
    shown = drawn(TRACE)
    assert (
        "agent trace: 1 model response(s), 2 turn(s) by the CLI's count, 3.2s of model time, $0.0123; "
        "the CLI's result success, attempts 1" in shown
    )
    assert "tokens: input 1,234, output 567, cache read 0, cache write 89" in shown
    assert "Read" in shown and "2,048" in shown and "12ms" in shown
    assert "[x] read the [file]" in shown  # a todo's brackets are its own text
    # The model's strings are text: no markup applied, no escape sequence let through.
    assert "[bold red]Bash[/]" in shown
    assert not CONTROL.search(shown), repr(shown)


def test_a_failed_attempt_says_its_outcome_before_the_clis_success() -> None:
    # The CLI answered "success" with an output agentq refused: the outcome leads.
    failed = {**TRACE, "outcome": "failed",
              "error": {"category": "parse", "message": "output failed the schema"}}  # fmt: skip
    shown = drawn(failed)
    assert shown.index("outcome: failed (parse: output failed the schema)") < shown.index(
        "the CLI's result success"
    )


def test_other_json_is_not_taken_for_a_worker_trace() -> None:
    assert not is_worker_trace({"turns": 2, "tools": [{"name": "Read"}]})
    assert not is_worker_trace([TRACE])
    assert not is_worker_trace({**TRACE, "usage": None})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELD = st.sampled_from(
    [
        "attempt",
        "at_ms",
        "tools",
        "usage",
        "error",
        "name",
        "status",
        "duration_ms",
        "input_bytes",
        "output_bytes",
        "content",
        "state",
    ]
)
ENTRY = st.dictionaries(FIELD, JSON, max_size=6) | JSON


@settings(max_examples=200, deadline=None, database=None)
@given(
    turns=st.lists(ENTRY, max_size=3),
    calls=st.lists(ENTRY, max_size=3),
    todos=st.lists(ENTRY, max_size=3) | JSON,
    usage=st.dictionaries(st.sampled_from(["input_tokens", "output_tokens"]), JSON),
    top=st.dictionaries(
        st.sampled_from(
            [
                "num_turns",
                "duration_ms",
                "cost_usd",
                "result_subtype",
                "attempts",
                "cache_efficiency_pct",
            ]
        ),
        JSON,
    ),
)
def test_any_values_in_the_worker_shape_draw_without_error_or_control_characters(
    turns: list[Any], calls: list[Any], todos: Any, usage: dict[str, Any], top: dict[str, Any]
) -> None:
    trace = {**top, "turns": turns, "tool_calls": calls, "todos": todos, "usage": usage}
    assert not CONTROL.search(drawn(trace))
