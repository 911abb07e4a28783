"""The worker's reader of a child's files, against anything a task could leave there."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentq.store.codec import to_item
from worker.child.files import MAX_CHILD_JSON_BYTES, read_json, read_usage

PROPERTIES = settings(max_examples=300, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

_KEYS = st.text(st.characters(codec=None), max_size=5) | st.sampled_from(["", "\ud800"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**45), 10**45) | st.floats() | _KEYS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=10,
)  # fmt: skip


def _usage_text(value: Any) -> bytes:
    # json.dumps writes NaN and Infinity as bare words, and lone surrogates escaped.
    return json.dumps({"usage": value, "cost_usd": value}).encode()


@PROPERTIES
@given(content=st.binary(max_size=300) | _VALUES.map(_usage_text))
@example(content=b'{"usage": {"": 1}, "cost_usd": 1e999}')
@example(content=b'{"usage": {"a": {"b": 1e200}}, "cost_usd": 0.1}')
def test_read_usage_keeps_only_what_can_be_stored_and_sent(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "usage.json").write_bytes(content)
    kept = read_usage(tmp_path)
    if kept is None:
        return
    assert set(kept) <= {"usage", "cost_usd"} and kept
    if "usage" in kept:
        assert isinstance(kept["usage"], dict)
        to_item({"usage": kept["usage"]})  # boto3's serializer takes it
        json.dumps(kept["usage"], allow_nan=False).encode()  # UTF-8 text, finite numbers
    if "cost_usd" in kept:
        cost = kept["cost_usd"]
        assert type(cost) in (int, float) and math.isfinite(cost) and cost >= 0


def test_a_well_formed_usage_file_is_kept_whole(tmp_path: Path) -> None:
    usage = {"input_tokens": 12, "output_tokens": 3, "service_tier": "standard",
             "server_tool_use": {"web_search_requests": 1}}  # fmt: skip
    (tmp_path / "usage.json").write_text(json.dumps({"usage": usage, "cost_usd": 0.0031}))
    assert read_usage(tmp_path) == {"usage": usage, "cost_usd": 0.0031}


def test_links_fifos_and_large_files_are_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text('{"usage": {"secret": 1}}')
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "usage.json").symlink_to(outside)
    assert read_usage(task_dir) is None
    os.mkfifo(task_dir / "error.json")  # opened without O_NONBLOCK, this would block
    assert read_json(task_dir / "error.json") is None
    large = task_dir / "large.json"
    large.write_text('{"x": "' + "y" * MAX_CHILD_JSON_BYTES + '"}')
    assert read_json(large) is None
    large.write_text('{"x": "' + "y" * (MAX_CHILD_JSON_BYTES - 20) + '"}')
    assert read_json(large) is not None
    assert read_json(task_dir / "missing.json") is None
