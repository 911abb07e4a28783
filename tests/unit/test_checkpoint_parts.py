"""A checkpoint's parts (agentq/checkpoints.py): however a session is cut into parts, and
however often it starts over, the parts join to the whole checkpoint; anything else a
reader is handed is refused with `CheckpointError`, never another exception."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.checkpoints import (
    Checkpoint,
    CheckpointError,
    Part,
    decode,
    decode_part,
    encode,
    encode_part,
    is_checkpoint_key,
    join_parts,
    part_key,
    split,
)
from agentq.store.keys import checkpoint_key

_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
_entry = st.dictionaries(st.sampled_from(["type", "uuid", "message"]), _text, max_size=3)


@st.composite
def _sessions(draw: st.DrawFn) -> list[tuple[str, list[dict[str, str]], list[int]]]:
    """One to three sessions in a row, each its entries and where its parts end."""
    sessions = []
    for _ in range(draw(st.integers(1, 3))):
        entries = draw(st.lists(_entry, min_size=1, max_size=8))
        cuts = sorted(draw(st.sets(st.integers(1, len(entries)), min_size=1)))
        sessions.append((str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1)))), entries, cuts))
    return sessions


@settings(max_examples=60, deadline=None)
@given(_sessions())
def test_parts_join_to_the_whole_checkpoint_of_the_last_session(
    sessions: list[tuple[str, list[dict[str, str]], list[int]]],
) -> None:
    parts = []
    for session, entries, cuts in sessions:
        whole = encode(Checkpoint(session_id=session, turns=len(entries), entries=entries))
        lines = split(whole).lines
        start = 0
        for turn, end in enumerate(cuts, 1):
            part = Part(session_id=session, turns=turn, first_entry=start, lines=lines[start:end])
            parts.append(decode_part(encode_part(part)))
            start = end
    session, entries, cuts = sessions[-1]
    joined = decode(join_parts(parts))
    assert joined == Checkpoint(session_id=session, turns=len(cuts), entries=entries[: cuts[-1]])


def test_a_part_that_does_not_follow_is_refused() -> None:
    session, other = str(uuid.uuid4()), str(uuid.uuid4())
    first = Part(session_id=session, turns=1, first_entry=0, lines=[b"{}", b"{}"])
    with pytest.raises(CheckpointError, match="starting at entry 3 follows 2 entries"):
        join_parts([first, Part(session_id=session, turns=2, first_entry=3, lines=[b"{}"])])
    with pytest.raises(CheckpointError, match="starting at entry 2 follows 2 entries"):
        join_parts([first, Part(session_id=other, turns=2, first_entry=2, lines=[b"{}"])])
    with pytest.raises(CheckpointError, match="entry 4 follows 0 entries of no session"):
        join_parts([Part(session_id=session, turns=1, first_entry=4, lines=[])])
    with pytest.raises(CheckpointError, match="no part starts the session"):
        join_parts([])


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300) | st.builds(lambda t: json.dumps(t).encode() + b"\n{}", _entry))
def test_whatever_bytes_a_reader_gets_are_a_checkpoint_or_refused(data: bytes) -> None:
    for read in (decode, decode_part):
        with contextlib.suppress(CheckpointError):
            read(data)


def test_every_object_of_a_checkpoint_is_known_by_its_key() -> None:
    assert is_checkpoint_key(checkpoint_key("acme", "r-1", 2))
    assert is_checkpoint_key(part_key("acme", "r-1", 2, 7))
    assert part_key("acme", "r-1", 2, 7) == "task/acme/r-1/attempt-2/checkpoint/part-000007.jsonl"
    assert not is_checkpoint_key("task/acme/r-1/attempt-2/logs/summary.log")
