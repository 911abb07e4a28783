"""The conversation model: a real resumed task's two checkpoints read as one conversation,
and the parser's promises (never raises, caps hold) as properties over any input.

The fixtures are the checkpoints a real CLI run left (tests/agent/test_agent_resume.py's
scenario: attempt 1 ran two Bash turns and was killed, attempt 2 resumed and finished),
with the CLI's larger attachment entries removed to keep them small.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.conversation import (
    MAX_BLOCK_CHARS,
    RESUME_PROMPT,
    AttemptCheckpoint,
    build_conversation,
    parse_transcript,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _attempt(n: int) -> AttemptCheckpoint:
    return AttemptCheckpoint(attempt=n, data=(FIXTURES / f"resumed-attempt-{n}.jsonl").read_bytes())


def test_a_resumed_task_reads_as_one_conversation_with_the_resume_marked() -> None:
    conversation = build_conversation([_attempt(2), _attempt(1)])

    kinds = [(t.attempt, t.kind) for t in conversation.turns]
    assert kinds == [
        (1, "prompt"),
        (1, "assistant"), (1, "tool_results"),
        (1, "assistant"), (1, "tool_results"),
        (2, "resume"),
        (2, "assistant"), (2, "tool_results"),
        (2, "assistant"), (2, "tool_results"),
    ]  # fmt: skip
    prompt = conversation.turns[0].blocks[0]
    assert "Work through the steps <img src=x onerror=alert(1)>." in prompt.text
    call = conversation.turns[1].blocks[0]
    assert (call.kind, call.tool, json.loads(call.text)) == (
        "tool_call", "Bash", {"command": "echo step-1"},
    )  # fmt: skip
    result = conversation.turns[2].blocks[0]
    assert (result.kind, result.tool, result.text, result.is_error) == (
        "tool_result", "Bash", "step-1", False,
    )  # fmt: skip
    assert conversation.turns[5].blocks[0].text == RESUME_PROMPT
    assert conversation.turns[8].blocks[0].tool == "StructuredOutput"
    first, second = conversation.attempts
    assert (first.attempt, first.turns, first.resumed) == (1, 5, False)
    assert (second.attempt, second.turns, second.resumed, second.fresh_session) == (
        2, 5, True, False,
    )  # fmt: skip
    assert conversation.skipped_lines == 0
    assert conversation.omitted_turns == 0


def test_an_entry_written_twice_in_one_checkpoint_is_shown_once_and_is_no_resume() -> None:
    lines = (FIXTURES / "resumed-attempt-1.jsonl").read_bytes().splitlines(keepends=True)
    doubled = AttemptCheckpoint(attempt=1, data=b"".join([*lines, lines[-1], lines[0]]))
    conversation = build_conversation([doubled, _attempt(2)])
    first, second = conversation.attempts
    assert (first.turns, first.resumed) == (5, False)
    assert (second.turns, second.resumed) == (5, True)


def test_a_follow_up_after_the_final_answer_is_marked_and_a_missing_checkpoint_said() -> None:
    source = (FIXTURES / "resumed-attempt-2.jsonl").read_bytes()
    follow_up = {
        "type": "user", "uuid": "f0110w-up", "sessionId": "6c4b69e6-f484-42f2-a2ee-2b40c1fccf7e",
        "message": {"role": "user", "content": "Now in three points."},
    }  # fmt: skip
    continued = source + json.dumps(follow_up).encode() + b"\n"
    conversation = build_conversation(
        [AttemptCheckpoint(attempt=1, data=continued),
         AttemptCheckpoint(attempt=2, data=None, problem="no checkpoint yet")],
        continues="r-source",
    )  # fmt: skip
    assert conversation.turns[-1].kind == "follow_up"
    assert conversation.turns[-1].blocks[0].text == "Now in three points."
    assert conversation.attempts[1].problem == "no checkpoint yet"
    assert conversation.continues == "r-source"


def test_malformed_lines_are_skipped_and_counted_and_secrets_and_controls_removed() -> None:
    entry = {
        "type": "assistant", "uuid": "a1",
        "message": {"role": "assistant", "content": [
            {"type": "text", "text": "key sk-ant-api03-abcdefghijklmnop \x1b]0;pwned\x07 ok"}]},
    }  # fmt: skip
    data = b"not json\n[1, 2]\n\xff\xfe\n" + json.dumps(entry).encode() + b"\n"
    conversation = build_conversation([AttemptCheckpoint(attempt=1, data=data)])
    assert conversation.skipped_lines == 3
    text = conversation.turns[0].blocks[0].text
    assert "sk-ant" not in text and "\x1b" not in text and "\x07" not in text
    assert text.endswith(" ok")


def test_long_blocks_and_long_conversations_are_cut_and_say_so() -> None:
    def user(i: int) -> dict[str, Any]:
        return {"type": "user", "uuid": f"u{i}", "sessionId": "s",
                "message": {"role": "user", "content": "x" * (MAX_BLOCK_CHARS + i)}}  # fmt: skip

    data = b"".join(json.dumps(user(i)).encode() + b"\n" for i in range(50))
    conversation = build_conversation([AttemptCheckpoint(attempt=1, data=data)],
                                      max_turns=10, head_turns=3)  # fmt: skip
    assert conversation.total_turns == 50
    assert [t.index for t in conversation.turns] == [0, 1, 2, *range(43, 50)]
    assert conversation.omitted_turns == 40
    assert all(len(b.text) == MAX_BLOCK_CHARS for t in conversation.turns for b in t.blocks)
    assert conversation.turns[-1].blocks[0].cut_chars == 49


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "message", "content", "role", "uuid", "sessionId", "text",
                         "tool_use_id", "name", "input", "id", "isSidechain", "model"])
        | st.text(max_size=5), inner, max_size=5),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300) | _json.map(lambda v: json.dumps(v).encode()),
                max_size=12),
       st.integers(min_value=1, max_value=5), st.integers(min_value=0, max_value=5))  # fmt: skip
def test_any_bytes_parse_without_raising_and_within_the_caps(
    lines: list[bytes], most: int, head: int
) -> None:
    data = b"\n".join(lines)
    transcript = parse_transcript(data)
    assert len(transcript.entries) + transcript.skipped_lines <= data.count(b"\n") + 1
    conversation = build_conversation(
        [AttemptCheckpoint(attempt=1, data=data), AttemptCheckpoint(attempt=2, data=data)],
        max_turns=most, head_turns=head,
    )  # fmt: skip
    assert len(conversation.turns) <= most
    assert conversation.total_turns == len(conversation.turns) + conversation.omitted_turns
    for turn in conversation.turns:
        for block in turn.blocks:
            assert len(block.text) <= MAX_BLOCK_CHARS
            assert not any(ord(c) < 32 and c not in "\t\n\r" for c in block.text)
    json.dumps(conversation.to_dict())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["user", "assistant"]),
    "uuid": st.text(max_size=3),
    "sessionId": st.sampled_from(["a", "b"]),
    "message": st.fixed_dictionaries({"content": st.one_of(
        st.text(max_size=50),
        st.lists(st.fixed_dictionaries({
            "type": st.sampled_from(["text", "tool_use", "tool_result", "image"]),
            "text": st.text(max_size=20), "id": st.text(max_size=2),
            "tool_use_id": st.text(max_size=2), "input": _json, "content": _json,
        }), max_size=3),
    )}),
}), max_size=15))  # fmt: skip
def test_entries_shaped_like_the_clis_never_break_the_reader(entries: list[dict[str, Any]]) -> None:
    data = "\n".join(json.dumps(e) for e in entries).encode()
    conversation = build_conversation([AttemptCheckpoint(attempt=1, data=data)])
    assert conversation.skipped_lines == 0
    assert sum(a.turns for a in conversation.attempts) == conversation.total_turns
