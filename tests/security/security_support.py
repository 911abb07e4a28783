"""Helpers of the security tests: a worker launched on the stack, and hostile SQS
messages for the poison tests (what a producer could put on the queue).

A `Hostile` is a message shape; `build(request_id)` turns it into a body and attributes
with a fresh request id, so examples never share a task.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import Stack
from hypothesis import strategies as st

from agentq.local.workers import REPO_ROOT, WorkerProcess, fast_env


@contextlib.contextmanager
def launched_worker(
    stack: Stack,
    name: str,
    env: Mapping[str, str] | None = None,
    *,
    log_dir: Path | None = None,
    interpreter: str = sys.executable,
    user: pwd.struct_passwd | None = None,
) -> Iterator[WorkerProcess]:
    """`python -m worker` on the stack with the tests' short intervals and `env` on top,
    in a session of its own; on the way out it is SIGKILLed with all it started.

    `interpreter` and `user` run it as another user (the isolation tests), which
    WorkerProcess.start cannot; its log is `log_dir/{name}.log`.
    """
    worker = WorkerProcess(name, log_dir)
    full = {**os.environ, **stack.env(), **fast_env(), **(env or {})}
    full.setdefault("WORKER_ID", f"{name}-{os.getpid()}")
    as_user: dict[str, Any] = {}
    if user is not None:
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    with worker.log_path.open("ab") as log:
        worker.process = subprocess.Popen(
            [interpreter, "-m", "worker"], env=full, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=REPO_ROOT, start_new_session=True, **as_user,
        )  # fmt: skip
    try:
        yield worker
    finally:
        worker.kill()


# What SQS accepts in a body or attribute (#x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD and up).
SQS_TEXT = st.characters(
    min_codepoint=0x20, codec="utf-8", exclude_characters="\ufffe\uffff",
    include_characters="\t\n\r",
)  # fmt: skip

# Lone surrogates only travel JSON-escaped (json.dumps' default ensure_ascii).
_ANY_TEXT = st.text(st.characters(codec=None), max_size=8)

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(),  # NaN and ±Infinity included: json.dumps writes them as bare literals
    st.integers(min_value=-(10**60), max_value=10**60),
    st.sampled_from([1e-200, 1e200, 10**38, 10**39 - 1]),
    _ANY_TEXT,
    st.sampled_from(["\ud800", "a\udfffb", "</input>", "\x00", "é"]),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)


@dataclass(frozen=True)
class Hostile:
    kind: str  # "envelope", "eventbridge" or "raw"
    definition: object
    tenant: object
    body_id: str  # "same", "absent", "other" or "number"
    input: object
    deep: int  # brackets spliced into the input (0: none)
    attribute: str | None  # requestId's DataType, None for no attribute
    raw: str
    not_before: object = None  # the body's notBefore, when not None
    resume: object = None  # the body's resume, when not None

    def build(self, request_id: str) -> tuple[str, dict[str, dict[str, Any]], bool]:
        """(body, SendMessage attributes, whether the request id is readable for sure)."""
        attributes: dict[str, dict[str, Any]] = {}
        if self.attribute == "Binary":
            attributes["requestId"] = {"DataType": "Binary", "BinaryValue": request_id.encode()}
        elif self.attribute == "Number":
            attributes["requestId"] = {"DataType": "Number", "StringValue": "12345"}
        elif self.attribute is not None:
            attributes["requestId"] = {"DataType": self.attribute, "StringValue": request_id}
        readable = self.attribute in ("String", "String.id") and self.body_id in ("same", "absent")
        if self.kind == "raw":
            return self.raw, attributes, self.attribute in ("String", "String.id")
        fields: dict[str, Any] = {"definition": self.definition, "input": self.input}
        if self.tenant is not None:
            fields["tenant"] = self.tenant
        if self.not_before is not None:
            fields["notBefore"] = self.not_before
        if self.resume is not None:
            fields["resume"] = self.resume
        ids = {"same": request_id, "other": "other-id", "number": 12345}
        if self.body_id in ids:
            fields["requestId"] = ids[self.body_id]
        body = json.dumps(fields)  # allow_nan: NaN and Infinity go out as bare literals
        if self.deep:
            body = body[:-1] + ', "deep": ' + "[" * self.deep + "]" * self.deep + "}"
        if self.kind == "eventbridge":
            body = '{"detail-type": "Task Requested", "source": "x", "detail": ' + body + "}"
        return body, attributes, readable


HOSTILE = st.builds(
    Hostile,
    kind=st.sampled_from(["envelope", "envelope", "eventbridge", "raw"]),
    definition=st.sampled_from(["sample-noop", "sample-noop", "no-such-def", 7, None]),
    tenant=st.sampled_from([None, "acme", "a b", 3]),
    body_id=st.sampled_from(["same", "same", "absent", "other", "number"]),
    input=st.one_of(st.dictionaries(_ANY_TEXT, JSON_VALUES, max_size=4), JSON_VALUES),
    deep=st.sampled_from([0, 0, 0, 31, 40, 10_000]),
    attribute=st.sampled_from([None, "String", "String", "String.id", "Number", "Binary"]),
    raw=st.text(SQS_TEXT, min_size=1, max_size=60),
    # Past or unusable times only: a task due later would wait, not settle.
    not_before=st.sampled_from([None, None, None, 1e200, 3e14, 10**40, -1, "soon", 10**12]),
    # Only JSON true and false are a task's own resume.
    resume=st.sampled_from([None, None, None, True, False, "true", 1, 0, [], {}]),
)


def is_finite_json(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(is_finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(is_finite_json(v) for v in value)
    return True
