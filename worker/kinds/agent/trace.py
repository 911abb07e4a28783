"""What an agent run did, from SDK hooks and messages → traces/session_trace.json.

`TraceRecorder.hooks()` gives the ``PreToolUse``/``PostToolUse``/``PostToolUseFailure``
callbacks that time each tool call and measure its input and output sizes (never
their content: the trace is uploaded and read by operators). `observe()` sees every
message: per-turn token usage (an assistant message arrives once per content block, so
turns are counted by message id) and the final result (turns, duration, cost).

Todo timings (when each todo was first seen pending, in progress and completed) come
from the CLI's planning tools: ``TodoWrite`` (a whole list per call) or, in newer CLIs,
``TaskCreate`` (pending; its response carries the id) and ``TaskUpdate`` (a status).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, cast

from claude_agent_sdk import (
    AssistantMessage,
    HookContext,
    HookInput,
    HookJSONOutput,
    HookMatcher,
    ResultMessage,
    ToolUseBlock,
)

TOKEN_FIELDS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
TODO_STATES: Final = ("pending", "in_progress", "completed")


def usage_of(raw: Mapping[str, Any] | None) -> dict[str, int]:
    raw = raw or {}
    return {name: int(raw.get(name) or 0) for name in TOKEN_FIELDS}


def cache_efficiency_pct(usage: Mapping[str, int]) -> float:
    """Share of prompt tokens served from the cache (what prompt caching saved)."""
    prompt = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    return round(100.0 * usage["cache_read_input_tokens"] / prompt, 1) if prompt else 0.0


def _size(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    return len(json.dumps(value, default=str).encode())


@dataclass
class ToolCall:
    id: str
    name: str
    attempt: int
    started_ms: float
    input_bytes: int
    duration_ms: float | None = None
    output_bytes: int | None = None
    status: str = "running"  # running | ok | error


@dataclass
class Todo:
    content: str
    first_seen_ms: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        seen = self.first_seen_ms
        pending, started, done = (seen.get(s) for s in TODO_STATES)
        return {
            "content": self.content,
            "state": next((s for s in reversed(TODO_STATES) if s in seen), "pending"),
            "first_seen_ms": dict(seen),
            "waited_ms": round(started - pending, 1)
            if started is not None and pending is not None
            else None,
            "worked_ms": round(done - started, 1)
            if done is not None and started is not None
            else None,
        }


@dataclass
class Turn:
    message_id: str
    attempt: int
    at_ms: float
    usage: dict[str, int]
    tools: list[str] = field(default_factory=list)
    error: str | None = None


class TraceRecorder:
    """Collects one task's trace across all of its attempts (times relative to start)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.attempt = 0
        self.tool_calls: dict[str, ToolCall] = {}
        self.todos: dict[str, Todo] = {}
        self._task_ids: dict[str, str] = {}  # TaskCreate id → subject
        self.turns: dict[str, Turn] = {}
        self.attempts: list[dict[str, Any]] = []
        self.result: ResultMessage | None = None  # the last one
        self.results: dict[int, ResultMessage] = {}  # by attempt
        self.first_message_ms: float | None = None
        self.result_ms: float | None = None
        self.last_assistant_error: str | None = None

    def now_ms(self) -> float:
        return round((time.monotonic() - self._t0) * 1000, 1)

    # -- attempts ----------------------------------------------------------------------

    def start_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self.last_assistant_error = None
        self.attempts.append({"attempt": attempt, "started_ms": self.now_ms()})

    def end_attempt(self, outcome: str, error: Mapping[str, Any] | None = None) -> None:
        record = self.attempts[-1]
        record["duration_ms"] = round(self.now_ms() - record["started_ms"], 1)
        record["outcome"] = outcome
        if error is not None:
            record["error"] = dict(error)

    # -- hooks -------------------------------------------------------------------------

    def hooks(self) -> dict[Any, list[HookMatcher]]:
        return {
            "PreToolUse": [HookMatcher(hooks=[self._pre_tool])],
            "PostToolUse": [HookMatcher(hooks=[self._post_tool])],
            "PostToolUseFailure": [HookMatcher(hooks=[self._post_tool_failure])],
        }

    async def _pre_tool(
        self, hook_input: HookInput, tool_use_id: str | None, _ctx: HookContext
    ) -> HookJSONOutput:
        data: Mapping[str, Any] = cast(Mapping[str, Any], hook_input)
        name = str(data.get("tool_name") or "?")
        call_id = tool_use_id or data.get("tool_use_id") or f"anon-{len(self.tool_calls)}"
        tool_input = data.get("tool_input")
        self.tool_calls[call_id] = ToolCall(
            id=call_id,
            name=name,
            attempt=self.attempt,
            started_ms=self.now_ms(),
            input_bytes=_size(tool_input),
        )
        if name == "TodoWrite" and isinstance(tool_input, Mapping):
            self._todo_update(tool_input.get("todos"))
        elif name == "TaskUpdate" and isinstance(tool_input, Mapping):
            key = self._task_ids.get(str(tool_input.get("taskId")))
            if key is not None:
                self._todo_seen(key, tool_input.get("status"))
        return {}  # no opinion: the permission mode and allowed tools decide

    async def _post_tool(
        self, hook_input: HookInput, tool_use_id: str | None, _ctx: HookContext
    ) -> HookJSONOutput:
        data: Mapping[str, Any] = cast(Mapping[str, Any], hook_input)
        response = data.get("tool_response")
        self._finish_tool(data, tool_use_id, "ok", response)
        if data.get("tool_name") == "TaskCreate" and isinstance(response, Mapping):
            task = response.get("task")
            if isinstance(task, Mapping) and task.get("id") is not None:
                subject = str(task.get("subject") or task["id"])
                self._task_ids[str(task["id"])] = subject
                self._todo_seen(subject, "pending")
        return {}

    async def _post_tool_failure(
        self, hook_input: HookInput, tool_use_id: str | None, _ctx: HookContext
    ) -> HookJSONOutput:
        data: Mapping[str, Any] = cast(Mapping[str, Any], hook_input)
        self._finish_tool(data, tool_use_id, "error", data.get("error"))
        return {}

    def _finish_tool(
        self, data: Mapping[str, Any], tool_use_id: str | None, status: str, output: Any
    ) -> None:
        call_id = tool_use_id or data.get("tool_use_id")
        call = self.tool_calls.get(call_id) if call_id else None
        if call is None:
            return
        call.duration_ms = round(self.now_ms() - call.started_ms, 1)
        call.output_bytes = _size(output)
        call.status = status

    def calls_named(self, name: str) -> int:
        """How many times the current attempt's model asked for the tool `name` (its
        tool_use blocks: a tool the CLI handles itself runs no hook)."""
        return sum(
            turn.tools.count(name) for turn in self.turns.values() if turn.attempt == self.attempt
        )

    def _todo_update(self, todos: Any) -> None:
        if not isinstance(todos, list):
            return
        for item in todos:
            if isinstance(item, Mapping):
                self._todo_seen(str(item.get("content") or ""), item.get("status"))

    def _todo_seen(self, content: str, state: Any) -> None:
        if not content or state not in TODO_STATES:
            return
        todo = self.todos.setdefault(content, Todo(content=content))
        todo.first_seen_ms.setdefault(str(state), self.now_ms())

    # -- messages ----------------------------------------------------------------------

    def observe(self, message: Any) -> None:
        if self.first_message_ms is None:
            self.first_message_ms = self.now_ms()
        if isinstance(message, AssistantMessage):
            if message.error:
                self.last_assistant_error = str(message.error)
            key = message.message_id or f"anon-{len(self.turns)}"
            turn = self.turns.get(key)
            if turn is None:
                turn = self.turns[key] = Turn(
                    message_id=key,
                    attempt=self.attempt,
                    at_ms=self.now_ms(),
                    usage=usage_of(message.usage),
                    error=str(message.error) if message.error else None,
                )
            for block in message.content:
                if isinstance(block, ToolUseBlock):
                    turn.tools.append(block.name)
        elif isinstance(message, ResultMessage):
            self.result = self.results[self.attempt] = message
            self.result_ms = self.now_ms()

    # -- output ------------------------------------------------------------------------

    def totals(self) -> dict[str, Any]:
        """What usage.json and the `Task Completed` event carry: every attempt is paid for."""
        usage = dict.fromkeys(TOKEN_FIELDS, 0)
        cost, turns, duration = 0.0, 0, 0
        for attempt in {t.attempt for t in self.turns.values()} | set(self.results):
            result = self.results.get(attempt)
            counted = usage_of(result.usage if result else None)
            if result is None or not any(counted.values()):
                # No result (stopped, failed early): add up what its turns reported.
                counted = {
                    k: sum(t.usage[k] for t in self.turns.values() if t.attempt == attempt)
                    for k in TOKEN_FIELDS
                }
            for name in TOKEN_FIELDS:
                usage[name] += counted[name]
            if result is not None:
                cost += float(result.total_cost_usd or 0.0)
                turns += int(result.num_turns)
                duration += int(result.duration_ms)
            else:
                turns += sum(1 for t in self.turns.values() if t.attempt == attempt)
        return {
            "usage": usage,
            "cost_usd": cost,
            "num_turns": turns,
            "duration_ms": duration or int(self.now_ms()),
        }

    def to_dict(self, **header: Any) -> dict[str, Any]:
        totals = self.totals()
        result = self.result
        calls = [asdict(c) for c in self.tool_calls.values()]
        return {
            **header,
            **totals,
            "cache_efficiency_pct": cache_efficiency_pct(totals["usage"]),
            "duration_api_ms": int(result.duration_api_ms) if result else None,
            "session_id": result.session_id if result else None,
            "result_subtype": result.subtype if result else None,
            "attempts": self.attempts,
            "turns": [asdict(t) for t in self.turns.values()],
            "tool_calls": calls,
            "tool_summary": _tool_summary(calls),
            "todos": [t.summary() for t in self.todos.values()],
            "timing_ms": {
                "first_message": self.first_message_ms,
                "result": self.result_ms,
                "total": self.now_ms(),
            },
        }


def _tool_summary(calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for call in calls:
        entry = summary.setdefault(call["name"], {"calls": 0, "errors": 0, "total_ms": 0.0})
        entry["calls"] += 1
        entry["errors"] += call["status"] == "error"
        entry["total_ms"] = round(entry["total_ms"] + (call["duration_ms"] or 0.0), 1)
    return summary
