"""`agentq trace ID` for a person: totals, tokens, turns, tool calls and todos.

The trace comes from S3 and its strings from the model (tool names, todos, errors), so
every field is checked for its type and every string made terminal-safe and escaped for
rich's markup. A trace not of the worker's shape (another writer, an older worker) is
shown as JSON instead; `--json` gives it as stored, but for each turn's output count (see
agentq.task_outputs.readable_trace: the totals hold the real one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentq.cli._views import duration, money

_TOKENS = (("input_tokens", "input"), ("output_tokens", "output"),
           ("cache_read_input_tokens", "cache read"),
           ("cache_creation_input_tokens", "cache write"))  # fmt: skip


def is_worker_trace(trace: object) -> bool:
    return (
        isinstance(trace, Mapping)
        and isinstance(trace.get("turns"), list)
        and isinstance(trace.get("tool_calls"), list)
        and isinstance(trace.get("usage"), Mapping)
    )


def print_trace(console: Console, trace: Mapping[str, Any], safe: Callable[[str], str]) -> None:
    """Draw a worker's trace; `safe` makes an untrusted string terminal-safe."""

    def text(value: object) -> str:
        return escape(safe(str(value))) if value is not None else ""

    def number(value: object) -> str:
        return (
            f"{value:,}" if isinstance(value, int | float) and not isinstance(value, bool) else "—"
        )

    def ms(value: object) -> str:
        return duration(float(value)) if isinstance(value, int | float) else "—"

    cost = trace.get("cost_usd")
    outcome, error = trace.get("outcome"), trace.get("error")
    if outcome is not None:
        # First: the CLI can answer "success" with an output agentq then refused.
        said = f"[bold]outcome[/bold]: {text(outcome)}"
        if isinstance(error, Mapping):
            said += f" ({text(error.get('category'))}: {text(error.get('message'))})"
        console.print(said)
    console.print(
        # The CLI's turn count includes the round that hands a tool's result back (one
        # structured answer is "2 turns"); the table lists the model's responses.
        f"[bold]agent trace[/bold]: {number(len(trace['turns']))} model response(s), "
        f"{number(trace.get('num_turns'))} turn(s) by the CLI's count, "
        f"{ms(trace.get('duration_ms'))} of model time, "
        f"{money(float(cost)) if isinstance(cost, int | float) else '—'}; "
        f"the CLI's result {text(trace.get('result_subtype') or 'none')}, "
        f"attempts {number(len(trace['attempts']) if isinstance(trace.get('attempts'), list) else None)}"
    )
    usage = trace["usage"]
    efficiency = trace.get("cache_efficiency_pct")
    console.print(
        "tokens: "
        + ", ".join(f"{label} {number(usage.get(name))}" for name, label in _TOKENS)
        + (f" (cache {number(efficiency)} %)" if isinstance(efficiency, int | float) else "")
    )
    turns = Table("response", "attempt", "at", "input", "output", "tools", "error",
                  title="model responses", title_justify="left")  # fmt: skip
    for index, turn in enumerate(t for t in trace["turns"] if isinstance(t, Mapping)):
        used = given if isinstance(given := turn.get("usage"), Mapping) else {}
        tools = named if isinstance(named := turn.get("tools"), list) else []
        turns.add_row(str(index + 1), number(turn.get("attempt")), ms(turn.get("at_ms")),
                      number(used.get("input_tokens")), number(used.get("output_tokens")),
                      text(", ".join(str(tool) for tool in tools)), text(turn.get("error")))  # fmt: skip
    console.print(turns)
    calls = [call for call in trace["tool_calls"] if isinstance(call, Mapping)]
    if calls:
        table = Table("tool", "status", "attempt", "duration", "input bytes", "output bytes",
                      title="tool calls", title_justify="left")  # fmt: skip
        for call in calls:
            table.add_row(text(call.get("name")), text(call.get("status")),
                          number(call.get("attempt")), ms(call.get("duration_ms")),
                          number(call.get("input_bytes")), number(call.get("output_bytes")))  # fmt: skip
        console.print(table)
    else:
        console.print("no tool calls")
    listed = given if isinstance(given := trace.get("todos"), list) else []
    todos = [todo for todo in listed if isinstance(todo, Mapping)]
    for todo in todos:
        mark = {"completed": "x", "in_progress": "~"}.get(str(todo.get("state")), " ")
        console.print(f"\\[{mark}] {text(todo.get('content'))}")
