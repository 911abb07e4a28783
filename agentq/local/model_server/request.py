"""Reading a Messages API request, and planning the fake model's answer to it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentq.local.model_server.scenario import (
    CLI_SYNTHETIC_ANSWER,
    SCRIPTED_ID,
    STRUCTURED_OUTPUT_TOOL,
    SYSTEM_REMINDER,
    Failure,
    Scenario,
)
from agentq.local.model_server.values import generate_value, snippet_of, stable_hash


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _texts(content: Any) -> list[str]:
    return [str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text"]


def _synthetic(message: dict[str, Any]) -> bool:
    """An answer the CLI wrote itself (resuming an interrupted session), not a model turn."""
    blocks = _blocks(message.get("content"))
    return len(blocks) == 1 and blocks[0].get("text") == CLI_SYNTHETIC_ANSWER


@dataclass(frozen=True)
class Request:
    body: dict[str, Any]
    raw_size: int
    prompt: str  # first user message text, without system reminders or markers
    all_text: str  # user/system texts (where markers and rule matches are looked for)
    turn: int  # assistant messages already in the conversation
    tools: dict[str, dict[str, Any]]
    # Where the latest user prompt sits in `messages` (a follow-up after a finished
    # answer asks for a new one), and its text.
    prompt_index: int = 0
    latest_prompt: str = ""

    @classmethod
    def parse(cls, body: dict[str, Any], raw_size: int) -> Request:
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        texts: list[str] = [*_texts(body.get("system"))]
        first_user: list[str] | None = None
        prompt_index, latest = 0, list[str]()
        for index, m in enumerate(body.get("messages", [])):
            if not isinstance(m, dict):
                continue
            if m.get("role") in ("user", "system"):
                own = [t for t in _texts(m.get("content")) if not t.startswith(SYSTEM_REMINDER)]
                texts.extend(own)
                if first_user is None and m.get("role") == "user":
                    first_user = own
                # The CLI sends a follow-up in one message with the last tool result.
                if m.get("role") == "user" and own:
                    prompt_index, latest = index, own
        tools = {
            str(t.get("name")): t
            for t in body.get("tools", []) or []
            if isinstance(t, dict) and t.get("name")
        }
        # The model's own turns: a resumed conversation counts on from where it stopped.
        turn = sum(1 for m in messages if m.get("role") == "assistant" and not _synthetic(m))
        return cls(
            body=body,
            raw_size=raw_size,
            prompt="\n".join(first_user or []),
            all_text="\n".join(texts),
            turn=turn,
            tools=tools,
            prompt_index=prompt_index,
            latest_prompt="\n".join(latest),
        )

    def tool_uses(self, name: str, *, since_prompt: bool = False) -> list[dict[str, Any]]:
        """The conversation's calls of tool `name` (`since_prompt`: after its latest prompt)."""
        messages = self.body.get("messages", [])
        return [
            b
            for m in (messages[self.prompt_index :] if since_prompt else messages)
            if isinstance(m, dict) and m.get("role") == "assistant"
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_use" and b.get("name") == name
        ]

    def scripted_calls(self) -> int:
        """How many scripted tool calls this conversation already made."""
        return sum(
            1
            for m in self.body.get("messages", [])
            if isinstance(m, dict) and m.get("role") == "assistant"
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_use" and str(b.get("id", "")).startswith(SCRIPTED_ID)
        )

    def tool_result(self, tool_use_id: str) -> dict[str, Any] | None:
        for m in self.body.get("messages", []):
            if isinstance(m, dict) and m.get("role") == "user":
                for b in _blocks(m.get("content")):
                    if b.get("type") == "tool_result" and b.get("tool_use_id") == tool_use_id:
                        return b
        return None

    @property
    def cacheable_chars(self) -> int:
        return len(json.dumps(self.body.get("system", ""))) + len(
            json.dumps(self.body.get("tools", []))
        )


def compute_usage(
    raw_size: int, cacheable_chars: int, turn: int, output_chars: int
) -> dict[str, int]:
    """Deterministic token counts, about 4 characters a token.

    ``input_tokens + cache_*`` add up to ``raw_size // 4`` (at least 1). The system prompt and
    tools count as cache *creation* on the first turn of a conversation and as cache *reads*
    on later turns; ``output_tokens`` is ``output_chars // 4`` (at least 1).
    """
    total = max(1, raw_size // 4)
    cached = max(0, min(total - 1, cacheable_chars // 4))
    return {
        "input_tokens": total - cached,
        "cache_creation_input_tokens": cached if turn == 0 else 0,
        "cache_read_input_tokens": cached if turn > 0 else 0,
        "output_tokens": max(1, output_chars // 4),
    }


def pick_failure(
    failures: Sequence[Failure], attempt: int, turn: int, turn_attempt: int
) -> Failure | None:
    """Failures without ``turn`` are consumed in order by the key's attempt number; those with
    ``turn`` likewise by the attempt number of that key and turn."""
    for group, n in (
        ([f for f in failures if f.turn is None], attempt),
        ([f for f in failures if f.turn == turn], turn_attempt),
    ):
        used = 0
        for f in group:
            if f.times is None or n <= used + f.times:
                return f
            used += f.times
    return None


def plan_turn(
    scn: Scenario, req: Request, prompt: str, key: str
) -> tuple[list[dict[str, Any]], str]:
    """Decide the assistant content of one successful turn."""
    snippet = snippet_of(prompt)
    tool_id_seed = stable_hash(key, prompt, req.turn)
    scripted_done = req.scripted_calls()
    if scripted_done < len(scn.tools):
        call = scn.tools[scripted_done]
        block = {
            "type": "tool_use",
            "id": f"{SCRIPTED_ID}{scripted_done}_{tool_id_seed:012x}",
            "name": call.name,
            "input": call.input,
        }
        return [block], "tool_use"

    so_tool = req.tools.get(STRUCTURED_OUTPUT_TOOL)
    if so_tool is not None:
        # An answer accepted before the latest prompt (a follow-up) does not answer it.
        previous = req.tool_uses(STRUCTURED_OUTPUT_TOOL, since_prompt=True)
        accepted = False
        if previous:
            result = req.tool_result(str(previous[-1].get("id")))
            accepted = result is not None and not result.get("is_error")
        if not accepted:
            if scn.has_output and (scn.output_times is None or len(previous) < scn.output_times):
                value = scn.output
            else:
                value = generate_value(so_tool.get("input_schema", {}), prompt)
            block = {
                "type": "tool_use",
                "id": f"toolu_offline_{tool_id_seed:012x}",
                "name": STRUCTURED_OUTPUT_TOOL,
                "input": value,
            }
            return [block], "tool_use"
        text = scn.text or "Structured output submitted."
        return [{"type": "text", "text": text}], "end_turn"

    text = scn.text or f"Offline model answer to: {snippet}"
    return [{"type": "text", "text": text}], "end_turn"
