"""What the worker reads of the files a child leaves behind: the child's word, not ours.

The task directory belongs to the child, and the task code in it may write anything
there: `usage.json` and `error.json` are read back into the STATE item and the task's
events, so a value DynamoDB or EventBridge would refuse (an empty map key, a number past
38 digits, ``1e999`` read as infinity, a lone surrogate) would fail the attempt's final
write after the task ran, and the task would run again until it dead-lettered. So a file
is read only if it is a plain file (not a link to the worker's /proc, not a FIFO that
would block the settle forever) of at most `MAX_CHILD_JSON_BYTES`, decoded strictly,
and what is taken from it is checked as storable; anything else is dropped with a
warning that names the file and the problem, never its content.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

from agentq.envelope import check_storable
from agentq.errors import InvalidInput
from agentq.json_text import decode_json

logger = logging.getLogger(__name__)

USAGE_FILE: Final = "usage.json"
# The SDK's usage record is a few hundred bytes, an error record a few KiB.
MAX_CHILD_JSON_BYTES: Final = 64 * 1024
# Kept on the STATE item and sent in events: small, whatever the child wrote.
MAX_USAGE_BYTES: Final = 8 * 1024
# Where an agent attempt's session resumed from, or why it started afresh.
MAX_RESUME_BYTES: Final = 1024
# No single task costs this much; a larger figure is the child's mistake, not a bill.
MAX_COST_USD: Final = 1_000_000.0


def plain_file(path: Path) -> bool:
    """A regular file, not a link (to anything) and not a device or FIFO."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def open_plain(path: Path) -> BinaryIO | None:
    """The child's file opened for reading if it is a plain file; None if it is missing,
    a link, or anything but a regular file (that one with a warning)."""
    try:
        # O_NOFOLLOW and O_NONBLOCK: a link or FIFO put in its place after any check
        # is refused by the open itself, and a FIFO cannot hold the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    source = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
        source.close()
        _ignored(path, "not a plain file")
        return None
    return source


def read_json(path: Path, *, limit: int = MAX_CHILD_JSON_BYTES) -> Any:
    """The file's JSON value, or None if it is missing, not a plain file, larger than
    `limit`, not UTF-8 or not strict JSON (see `agentq.json_text.decode_json`)."""
    opened = open_plain(path)
    if opened is None:
        return None
    with opened as source:
        data = source.read(limit + 1)
    if len(data) > limit:
        return _ignored(path, f"larger than {limit} bytes")
    try:
        return decode_json(data.decode("utf-8"), name=path.name)
    except UnicodeDecodeError:
        return _ignored(path, "not UTF-8 text")
    except InvalidInput as invalid:
        return _ignored(path, invalid.problem)


def read_usage(task_dir: Path) -> dict[str, Any] | None:
    """`{"usage": {...}, "cost_usd": n, "resume": {...}}` from the child's usage.json, each part kept
    only if agentq can store and send it; None when nothing usable is there."""
    data = read_json(task_dir / USAGE_FILE)
    if not isinstance(data, Mapping):
        if data is not None:
            _ignored(task_dir / USAGE_FILE, "not a JSON object")
        return None
    kept: dict[str, Any] = {}
    usage = data.get("usage")
    if usage is not None:
        problem = _unstorable_usage(usage)
        if problem:
            _ignored(task_dir / USAGE_FILE, f"usage {problem}")
        else:
            kept["usage"] = usage
    cost = data.get("cost_usd")
    if cost is not None:
        if _plausible_cost(cost):
            kept["cost_usd"] = cost
        else:
            _ignored(task_dir / USAGE_FILE, "cost_usd is not a number of dollars")
    resume = data.get("resume")
    if resume is not None:
        problem = _unstorable_record(resume, "resume", MAX_RESUME_BYTES)
        if problem:
            _ignored(task_dir / USAGE_FILE, f"resume {problem}")
        else:
            kept["resume"] = resume
    return kept or None


def _unstorable_record(record: object, name: str, limit: int) -> str | None:
    if not isinstance(record, Mapping):
        return "is not a JSON object"
    try:
        check_storable(record, name=name, depth=2)
    except InvalidInput as invalid:
        return f"{invalid.field}: {invalid.problem}"
    if len(json.dumps(record).encode()) > limit:
        return f"is larger than {limit} bytes"
    return None


def _unstorable_usage(usage: object) -> str | None:
    if not isinstance(usage, Mapping):
        return "is not a JSON object"
    try:
        # On the STATE item it is an attribute; in a stored event, inside the payload.
        check_storable(usage, name="usage", depth=2)
    except InvalidInput as invalid:
        return f"{invalid.field}: {invalid.problem}"
    if len(json.dumps(usage).encode()) > MAX_USAGE_BYTES:
        return f"is larger than {MAX_USAGE_BYTES} bytes"
    return None


def _plausible_cost(cost: object) -> bool:
    return (
        isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and 0 <= cost <= MAX_COST_USD
    )


def _ignored(path: Path, problem: str) -> None:
    logger.warning("child file ignored", extra={"file": path.name, "problem": problem[:200]})
