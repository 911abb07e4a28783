"""The benchmarks' side log, read while tasks append to it."""

from __future__ import annotations

import json
from pathlib import Path

from bench.stack import read_side_log


def test_a_line_still_being_appended_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "side.jsonl"
    whole = {"requestId": "r-1", "event": "start", "t": 1.5}
    line = json.dumps(whole) + "\n"
    path.write_text(line + line[:20])  # a second task's write, seen halfway
    assert read_side_log(path) == [whole]
    path.write_text(line + line)
    assert read_side_log(path) == [whole, whole]
