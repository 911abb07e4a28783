"""`agentq trace ID --conversation` for a person: the turns of an agent task's session.

Every text came from the model, a tool or a task's input: it is made terminal-safe (no
control characters) and escaped for rich's markup before it is drawn. The model
(agentq.conversation) has already scrubbed secrets and capped each block.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from agentq.conversation import Block, Conversation, Turn

_LABEL = {
    "prompt": "[bold]prompt[/bold]",
    "resume": "[yellow]↻ resumed here[/yellow]",
    "follow_up": "[cyan]follow-up (continuation)[/cyan]",
    "assistant": "[green]assistant[/green]",
    "tool_results": "[dim]tool results[/dim]",
    "user": "user",
}


def print_conversation(
    console: Console, request_id: str, conversation: Conversation, safe: Callable[[str], str]
) -> None:
    """Draw the conversation; `safe` makes an untrusted string terminal-safe."""

    def text(value: str) -> str:
        return escape(safe(value))

    heading = f"conversation of task {text(request_id)}"
    if conversation.continues:
        heading += f" (continues task {text(conversation.continues)})"
    console.print(f"[bold]{heading}[/bold]")
    if conversation.note:
        console.print(f"[dim]{text(conversation.note)}[/dim]")
    by_attempt = {part.attempt: part for part in conversation.attempts}
    current: int | None = None
    previous: Turn | None = None
    for turn in conversation.turns:
        if previous is not None and turn.index > previous.index + 1:
            console.print(f"[dim]… {turn.index - previous.index - 1} turns not shown …[/dim]")
        if turn.attempt != current:
            current = turn.attempt
            part = by_attempt.get(current)
            how = ""
            if part is not None and part.resumed:
                how = " · resumed from an earlier attempt's checkpoint"
            elif part is not None and part.fresh_session:
                how = " · started afresh"
            console.rule(f"attempt {current}{how}", align="left")
        console.print(_LABEL.get(turn.kind, turn.kind))
        for block in turn.blocks:
            console.print(_block(block, text), highlight=False)
        previous = turn
    for part in conversation.attempts:
        if part.problem:
            console.print(f"[dim]attempt {part.attempt}: {text(part.problem)}[/dim]")
    if conversation.omitted_turns:
        console.print(f"[dim]{conversation.total_turns} turns in all, "
                      f"{conversation.omitted_turns} not shown[/dim]")  # fmt: skip
    if conversation.skipped_lines:
        console.print(f"[dim]{conversation.skipped_lines} unreadable transcript lines "
                      "skipped[/dim]")  # fmt: skip


def _block(block: Block, text: Callable[[str], str]) -> str:
    cut = f" [dim]… {block.cut_chars} more characters[/dim]" if block.cut_chars else ""
    body = _indent(text(block.text))
    if block.kind == "tool_call":
        return f"  → [magenta]{text(block.tool or '?')}[/magenta] {body}{cut}"
    if block.kind == "tool_result":
        mark = "[red]error[/red] " if block.is_error else ""
        return f"  ← {mark}[magenta]{text(block.tool or 'tool')}[/magenta] {body}{cut}"
    return f"  {body}{cut}"


def _indent(value: str) -> str:
    return value.replace("\n", "\n    ")
