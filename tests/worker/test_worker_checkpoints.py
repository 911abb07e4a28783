"""Session checkpoints in S3 (worker/settle/checkpoints.py): fenced keys, newest-below reads,
uploads only of what changed, scrubbed, none after a lost lease, and faults that end in
a fresh start rather than a failed task. Real boto3 against moto."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import Stack

from agentq import security
from agentq.aws import make_client, new_session
from agentq.checkpoints import (
    SNAPSHOT_EVERY,
    Checkpoint,
    Part,
    decode,
    decode_part,
    encode,
    encode_part,
    next_snapshot,
    part_key,
    read_attempt,
)
from agentq.envelope import TaskEnvelope
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.jobs import result_key
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION
from agentq.states import TaskState
from agentq.store import Lease, TaskRecord, TaskStore
from worker.child.files import read_usage
from worker.kinds.agent.checkpoint import CHECKPOINT_FILE, RESTORE_FILE
from worker.settle.checkpoints import (
    CheckpointUploader,
    checkpoint_key,
    restore,
    restore_source,
    resumable,
)

SESSION = str(uuid.uuid4())


def _checkpoint(turns: int, text: str = "hello", *, entries: int | None = None,
                session: str = SESSION) -> bytes:  # fmt: skip
    """`entries` numbered entries of `text`, else one that is `text`."""
    texts = [text] if entries is None else [f"{text} {n}" for n in range(entries)]
    rows = [{"type": "user", "message": {"role": "user", "content": t}} for t in texts]
    return encode(Checkpoint(session_id=session, turns=turns, entries=rows))


def _put(stack: Stack, key: str, body: bytes) -> None:
    stack.s3.put_object(Bucket=stack.resources.bucket, Key=key, Body=body)


def _restore(stack: Stack, attempt: int, task_dir: Path, *, s3: Any = None) -> Any:
    return restore(s3 or stack.s3, stack.resources.bucket, tenant="acme", request_id="r-1",
                   attempt=attempt, task_dir=task_dir)  # fmt: skip


def test_the_key_carries_tenant_and_attempt() -> None:
    assert checkpoint_key("acme", "r-1", 2) == "task/acme/r-1/attempt-2/checkpoint/session.jsonl"
    assert len({checkpoint_key(t, "r-1", a) for t in ("acme", "zeta") for a in (1, 2)}) == 4


def test_only_an_agent_definition_that_opts_in_is_resumable() -> None:
    assert resumable("agent", {"resume": True})
    assert not resumable("agent", {"resume": "yes"})
    assert not resumable("agent", {})
    assert not resumable("python", {"resume": True})


def test_a_tasks_own_resume_decides_over_its_definitions() -> None:
    assert resumable("agent", {}, True)
    assert not resumable("agent", {"resume": True}, False)
    assert resumable("agent", {"resume": True}, None)
    assert not resumable("python", {"resume": True}, True)  # only an agent keeps a session


def test_a_retry_reads_the_newest_checkpoint_at_or_below_its_attempt(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    stack = inproc_stack
    _put(stack, checkpoint_key("acme", "r-1", 1), _checkpoint(1))
    # A later attempt's checkpoint (a newer holder's) is never taken by an older attempt.
    _put(stack, checkpoint_key("acme", "r-1", 3), _checkpoint(3))
    # Another tenant's task of the same id is never read.
    _put(stack, checkpoint_key("zeta", "r-1", 2), _checkpoint(9))

    assert _restore(stack, 2, tmp_path / "a2") == {"from_attempt": 1, "parts": 0}
    assert decode((tmp_path / "a2" / RESTORE_FILE).read_bytes()).turns == 1
    assert _restore(stack, 5, tmp_path / "a5") == {"from_attempt": 3, "parts": 0}
    assert decode((tmp_path / "a5" / RESTORE_FILE).read_bytes()).turns == 3
    # Attempt 3 run again (an operator's retry restarts the count): its own checkpoint.
    assert _restore(stack, 3, tmp_path / "a3") == {"from_attempt": 3, "parts": 0}


def test_no_checkpoint_is_no_resume(inproc_stack: Stack, tmp_path: Path) -> None:
    assert _restore(inproc_stack, 3, tmp_path) is None
    assert not (tmp_path / RESTORE_FILE).exists()


def _throttled_s3(stack: Stack, operation: str) -> Any:
    """An S3 client whose every call of `operation` is throttled. Two attempts, not
    agentq's ten: the same story (botocore retried, then gave up), sooner."""
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    s3 = session.client("s3", endpoint_url=stack.resources.endpoint_for("s3"),
                        config=Config(retries={"mode": "standard", "max_attempts": 2}))  # fmt: skip
    throttled = FaultRule(op=f"s3:{operation}", kind=Kind.THROTTLE, rate=1.0)
    install(s3, FaultInjector(FaultSpec(rules=(throttled,)), seed=3))
    return s3


class _Switch:
    """The uploader's S3: puts go to `current` (switched by a test), and are named."""

    def __init__(self, s3: Any) -> None:
        self.current, self.puts = s3, list[str]()

    def put_object(self, **kwargs: Any) -> Any:
        self.puts.append(kwargs["Key"].rsplit("/", 1)[-1])
        return self.current.put_object(**kwargs)


def test_a_checkpoint_s3_keeps_refusing_is_a_fresh_start_not_a_failure(
    stack: Stack, tmp_path: Path
) -> None:
    _put(stack, checkpoint_key("acme", "r-1", 1), _checkpoint(2))
    s3 = _throttled_s3(stack, "GetObject")

    offered = _restore(stack, 2, tmp_path, s3=s3)

    assert offered == {"unreadable": "checkpoint of attempt 2 unreadable (ClientError)"}
    assert not (tmp_path / RESTORE_FILE).exists()


def _uploader(
    stack: Stack, task_dir: Path, allowed: list[bool], s3: Any = None, first_part: int = 1
) -> Any:
    lease = Lease(request_id="r-1", tenant="acme", token="t", worker_id="w", attempt=1,
                  effective_until_ms=0)  # fmt: skip
    return CheckpointUploader(s3 or stack.s3, stack.resources.bucket, lease, task_dir,
                              interval_s=3600, allowed=lambda: allowed[0],
                              first_part=first_part)  # fmt: skip


def _write(task_dir: Path, data: bytes) -> None:
    path = task_dir / CHECKPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name("partial")
    partial.write_bytes(data)
    partial.replace(path)  # as the child writes it


def _stored(stack: Stack) -> bytes:
    """Attempt 1's checkpoint as a retry reads it (the whole one, else its parts)."""
    found = read_attempt(stack.s3, stack.resources.bucket, "acme", "r-1", 1)
    assert found is not None and found.whole
    return found.data


def _part(stack: Stack, number: int) -> Part:
    key = part_key("acme", "r-1", 1, number)
    return decode_part(stack.s3.get_object(Bucket=stack.resources.bucket, Key=key)["Body"].read())


def test_the_uploader_sends_only_a_changed_checkpoint(inproc_stack: Stack, tmp_path: Path) -> None:
    uploader = _uploader(inproc_stack, tmp_path, [True])
    assert not uploader.sync()  # nothing written yet
    _write(tmp_path, _checkpoint(1))
    assert uploader.sync()
    assert not uploader.sync()  # unchanged: no request
    _write(tmp_path, _checkpoint(2, "hello again"))
    assert uploader.sync()
    assert uploader.uploads == 2
    assert decode(_stored(inproc_stack)).turns == 2


def test_the_uploader_waits_its_interval_between_passes(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    # Each turn rewrites the file; however fast turns come, one pass per interval uploads.
    waits: list[float] = []

    def pause(interval_s: float) -> bool:
        waits.append(interval_s)
        for _ in range(3):  # three turns while the uploader waits
            _write(tmp_path, _checkpoint(len(waits) * 3, "t", entries=len(waits) * 3))
        return len(waits) > 2  # stopped after the second pass

    lease = Lease(request_id="r-1", tenant="acme", token="t", worker_id="w", attempt=1,
                  effective_until_ms=0)  # fmt: skip
    uploader = CheckpointUploader(inproc_stack.s3, inproc_stack.resources.bucket, lease,
                                  tmp_path, interval_s=2.5, allowed=lambda: True,
                                  pause=pause).start()  # fmt: skip
    uploader.stop()
    assert waits == [2.5, 2.5, 2.5]
    assert uploader.uploads == 2  # a part a pass, not a part a turn
    assert [_part(inproc_stack, n).turns for n in (1, 2)] == [3, 6]


def test_each_part_holds_only_the_entries_added_since_the_last(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    uploader = _uploader(inproc_stack, tmp_path, [True])
    for entries in (2, 5, 6):
        _write(tmp_path, _checkpoint(entries, "turn", entries=entries))
        assert uploader.sync()
    parts = [_part(inproc_stack, n) for n in (1, 2, 3)]
    assert [(p.first_entry, len(p.lines), p.turns) for p in parts] == [(0, 2, 2), (2, 3, 5),
                                                                        (5, 1, 6)]  # fmt: skip
    # The entries a part carries are the new ones, byte for byte.
    assert parts[2].lines == [b'{"type": "user", "message": {"role": "user", "content": "turn 5"}}']
    assert _stored(inproc_stack) == _checkpoint(6, "turn", entries=6)
    # A rewrite that only touched the file (same entries) sends nothing.
    _write(tmp_path, _checkpoint(6, "turn", entries=6))
    assert not uploader.sync()


def test_a_new_session_in_the_attempt_starts_its_parts_afresh(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    uploader = _uploader(inproc_stack, tmp_path, [True])
    _write(tmp_path, _checkpoint(3, "old", entries=3))
    assert uploader.sync()
    # An in-attempt retry started its session over: the old entries are not its prefix.
    fresh = _checkpoint(1, "new", entries=4, session=str(uuid.uuid4()))
    _write(tmp_path, fresh)
    assert uploader.sync()
    assert _part(inproc_stack, 2).first_entry == 0
    assert _stored(inproc_stack) == fresh
    # Entries that changed under the same session (not a prefix any more) start afresh too.
    changed = _checkpoint(5, "changed", entries=5)
    _write(tmp_path, changed)
    assert uploader.sync() and _part(inproc_stack, 3).first_entry == 0
    assert _stored(inproc_stack) == changed


class _Counted:
    """The S3 client, counting the requests a reader makes."""

    def __init__(self, s3: Any) -> None:
        self.s3, self.calls = s3, list[str]()

    def get_object(self, **kwargs: Any) -> Any:
        self.calls.append("GET " + kwargs["Key"].split("/", 3)[-1])
        return self.s3.get_object(**kwargs)

    def head_object(self, **kwargs: Any) -> Any:
        self.calls.append("HEAD " + kwargs["Key"].split("/", 3)[-1])
        return self.s3.head_object(**kwargs)


def test_a_reader_starts_at_the_newest_snapshot_part(inproc_stack: Stack, tmp_path: Path) -> None:
    stack = inproc_stack
    uploader = _uploader(stack, tmp_path, [True])
    last = SNAPSHOT_EVERY + 3
    for entries in range(1, last + 1):
        _write(tmp_path, _checkpoint(entries, "t", entries=entries))
        assert uploader.sync()
    snapshot = _part(stack, SNAPSHOT_EVERY + 1)
    assert (snapshot.first_entry, len(snapshot.lines)) == (0, SNAPSHOT_EVERY + 1)
    assert _part(stack, SNAPSHOT_EVERY + 2).first_entry == SNAPSHOT_EVERY + 1

    counted = _Counted(stack.s3)
    found = read_attempt(counted, stack.resources.bucket, "acme", "r-1", 1)
    assert found is not None and found.data == _checkpoint(last, "t", entries=last)
    folder = "attempt-1/checkpoint/"
    parts = [f"{folder}part-{n:06d}.jsonl" for n in range(SNAPSHOT_EVERY + 1, last + 2)]
    assert counted.calls == [
        f"GET {folder}session.jsonl",  # no whole checkpoint: the attempt never stopped
        f"HEAD {folder}part-000001.jsonl",
        f"HEAD {folder}part-{SNAPSHOT_EVERY + 1:06d}.jsonl",
        f"HEAD {folder}part-{2 * SNAPSHOT_EVERY + 1:06d}.jsonl",
        *(f"GET {name}" for name in parts),  # the last one is missing: the end
    ]


def test_a_part_that_failed_goes_again_with_what_came_since(stack: Stack, tmp_path: Path) -> None:
    s3 = _Switch(stack.s3)
    uploader = _uploader(stack, tmp_path, [True], s3=s3)
    _write(tmp_path, _checkpoint(1, "t", entries=1))
    assert uploader.sync()
    s3.current = _throttled_s3(stack, "PutObject")
    _write(tmp_path, _checkpoint(2, "t", entries=2))
    assert not uploader.sync()  # botocore gave up
    assert not uploader.sync()  # the same file: tried again, still throttled
    s3.current = stack.s3
    _write(tmp_path, _checkpoint(3, "t", entries=3))
    assert uploader.sync()
    assert (_part(stack, 2).first_entry, len(_part(stack, 2).lines)) == (1, 2)
    assert _stored(stack) == _checkpoint(3, "t", entries=3)


def test_parts_that_do_not_join_are_a_fresh_start(inproc_stack: Stack, tmp_path: Path) -> None:
    stack = inproc_stack
    line = b'{"type": "user"}'
    _put(stack, part_key("acme", "r-1", 1, 1), encode_part(
        Part(session_id=SESSION, turns=1, first_entry=0, lines=[line])))  # fmt: skip
    # Part 2 says it follows three entries: a part between them is missing.
    _put(stack, part_key("acme", "r-1", 1, 2), encode_part(
        Part(session_id=SESSION, turns=4, first_entry=3, lines=[line])))  # fmt: skip
    offered = _restore(stack, 2, tmp_path)
    assert offered is not None and offered["unreadable"].startswith(
        "checkpoint of attempt 1 is corrupt: a part starting at entry 3 follows 1 entries"
    )
    assert not (tmp_path / RESTORE_FILE).exists()


def test_stopping_puts_the_whole_checkpoint_a_retry_reads_in_one_get(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    uploader = _uploader(inproc_stack, tmp_path, [True]).start()
    _write(tmp_path, _checkpoint(3, "t", entries=3))
    uploader.stop()
    assert uploader.final_key == checkpoint_key("acme", "r-1", 1)
    counted = _Counted(inproc_stack.s3)
    assert _restore(inproc_stack, 2, tmp_path, s3=counted) == {"from_attempt": 1, "parts": 0}
    assert counted.calls == [
        "GET attempt-2/checkpoint/session.jsonl",  # attempt 2 left nothing
        "HEAD attempt-2/checkpoint/part-000001.jsonl",
        "GET attempt-1/checkpoint/session.jsonl",  # attempt 1's whole checkpoint
        "HEAD attempt-1/checkpoint/part-000001.jsonl",  # no later run's part past it
    ]
    assert decode((tmp_path / RESTORE_FILE).read_bytes()) == decode(_checkpoint(3, "t", entries=3))


def test_an_attempt_run_again_numbers_its_parts_past_the_first_runs_and_they_win(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    # Run 1 of attempt 1 uploads two parts, then ends: its whole checkpoint.
    stack = inproc_stack
    first = _uploader(stack, tmp_path / "run1", [True])
    for entries in (1, 2):
        _write(tmp_path / "run1", _checkpoint(entries, "t", entries=entries))
        assert first.sync()
    _write(tmp_path / "run1", _checkpoint(3, "t", entries=3))
    first.stop()
    # An operator's retry runs attempt 1 again: it restores its own checkpoint and goes on
    # numbering at the next snapshot, past the parts the whole one covers.
    offered = _restore(stack, 1, tmp_path / "run2")
    assert offered == {"from_attempt": 1, "parts": 2}
    assert next_snapshot(offered["parts"]) == SNAPSHOT_EVERY + 1
    second = _uploader(stack, tmp_path / "run2", [True], first_part=next_snapshot(2))
    for entries in (4, 5):
        _write(tmp_path / "run2", _checkpoint(entries, "t", entries=entries))
        assert second.sync()
    # Killed before it could put its own whole checkpoint: its parts are the resume point.
    found = read_attempt(stack.s3, stack.resources.bucket, "acme", "r-1", 1)
    assert found is not None and decode(found.data) == decode(_checkpoint(5, "t", entries=5))
    assert found.parts == SNAPSHOT_EVERY + 2
    assert _part(stack, SNAPSHOT_EVERY + 1).first_entry == 0  # the new run's first is whole
    assert [_part(stack, n).turns for n in (1, 2)] == [1, 2]  # run 1's parts untouched
    # Stopped, the new run's whole checkpoint names its own parts and is read again.
    second.stop()
    again = read_attempt(stack.s3, stack.resources.bucket, "acme", "r-1", 1)
    assert again is not None and again.parts == SNAPSHOT_EVERY + 2
    assert decode(again.data).turns == 5


def test_the_uploaded_transcript_is_scrubbed_of_the_workers_secrets(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    secret = "sk-ant-api03-" + "q" * 40
    security.remember_environment({"ANTHROPIC_API_KEY": secret})
    try:
        _write(tmp_path, _checkpoint(1, f"the key is {secret}"))
        uploader = _uploader(inproc_stack, tmp_path, [True])
        assert uploader.sync()
        uploader.stop()
    finally:
        security.remember_environment({})
    bucket = inproc_stack.resources.bucket
    for key in (part_key("acme", "r-1", 1, 1), checkpoint_key("acme", "r-1", 1)):
        stored = inproc_stack.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert secret.encode() not in stored
        assert f"the key is {security.REDACTED}".encode() in stored


def test_nothing_is_uploaded_once_the_lease_is_lost(inproc_stack: Stack, tmp_path: Path) -> None:
    allowed = [True]
    uploader = _uploader(inproc_stack, tmp_path, allowed).start()
    _write(tmp_path, _checkpoint(1))
    assert uploader.sync()
    allowed[0] = False
    _write(tmp_path, _checkpoint(2, "after the lease"))
    uploader.stop()  # its last pass too, and no whole checkpoint
    assert decode(_stored(inproc_stack)).turns == 1
    assert uploader.final_key is None


def test_the_last_pass_at_stop_uploads_the_final_turn(stack: Stack, tmp_path: Path) -> None:
    uploader = _uploader(stack, tmp_path, [True]).start()
    _write(tmp_path, _checkpoint(4))
    uploader.stop()
    assert decode(_stored(stack)).turns == 4
    assert uploader.uploads == 0  # the whole checkpoint only: no part besides it


def test_a_refused_whole_checkpoint_leaves_a_last_part_instead(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    class WholeRefused(_Switch):  # S3 fails the whole checkpoint's put only
        def put_object(self, **kwargs: Any) -> Any:
            if kwargs["Key"].endswith("session.jsonl"):
                raise ClientError({"Error": {"Code": "SlowDown"}}, "PutObject")
            return super().put_object(**kwargs)

    s3 = WholeRefused(inproc_stack.s3)
    uploader = _uploader(inproc_stack, tmp_path, [True], s3=s3)
    _write(tmp_path, _checkpoint(2, "t", entries=2))
    assert uploader.sync()
    _write(tmp_path, _checkpoint(3, "t", entries=3))
    uploader.stop()
    assert uploader.final_key is None
    assert s3.puts == ["part-000001.jsonl", "part-000002.jsonl"]  # the whole one failed
    assert _stored(inproc_stack) == _checkpoint(3, "t", entries=3)  # a retry's resume point


def test_an_upload_applied_then_failed_leaves_the_same_checkpoint(
    stack: Stack, tmp_path: Path
) -> None:
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    s3 = make_client(session, "s3", endpoint_url=stack.resources.endpoint_for("s3"))
    applied = FaultRule(op="s3:PutObject", kind=Kind.APPLIED_THEN_FAILED, rate=1.0, limit=1)
    install(s3, FaultInjector(FaultSpec(rules=(applied,)), seed=3))
    data = _checkpoint(2, "x" * 5000)
    _write(tmp_path, data)
    assert _uploader(stack, tmp_path, [True], s3=s3).sync()
    assert _stored(stack) == data  # botocore rewound the body and sent the same bytes


@pytest.mark.parametrize(
    ("resume", "kept"),
    [
        ({"status": "resumed", "from_attempt": 1, "turns": 3}, True),
        ({"status": "fresh", "reason": "corrupt"}, True),
        ("resumed", False),
        ({"reason": "x" * 5000}, False),
    ],
)
def test_the_childs_resume_record_reaches_the_events_only_when_storable(
    tmp_path: Path, resume: Any, kept: bool
) -> None:
    (tmp_path / "usage.json").write_text(json.dumps({"cost_usd": 0.1, "resume": resume}))
    usage = read_usage(tmp_path)
    assert usage is not None
    assert ("resume" in usage) is kept
    if kept:
        assert usage["resume"] == resume


def _source(stack: Stack, *, tenant: str = "acme", checkpoint: bool = True) -> TaskRecord:
    """A completed task's STATE item as the settler leaves it (attempt 2 the winner)."""
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    envelope = TaskEnvelope(request_id="src-1", tenant=tenant, definition="notes")
    lease = store.acquire(envelope, worker_id="w", lease_seconds=60, max_attempts=3)
    bucket = stack.resources.bucket
    fields: dict[str, Any] = {"result": {"bucket": bucket, "key": result_key(tenant, "src-1", 1)}}
    if checkpoint:
        fields["checkpoint"] = {"bucket": bucket, "key": checkpoint_key(tenant, "src-1", 1)}
    store.finalize(lease, TaskState.COMPLETED, fields=fields)
    return store.require(tenant, "src-1")


def _continue(stack: Stack, source: TaskRecord | None, task_dir: Path, s3: Any = None) -> Any:
    return restore_source(s3 or stack.s3, stack.resources.bucket, source=source,
                          source_id="src-1", task_dir=task_dir)  # fmt: skip


def test_a_continuation_takes_the_checkpoint_its_source_names(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    source = _source(inproc_stack)
    _put(inproc_stack, checkpoint_key("acme", "src-1", 1), _checkpoint(4))
    # A stale holder's later attempt left one too: the STATE item does not name it.
    _put(inproc_stack, checkpoint_key("acme", "src-1", 2), _checkpoint(9))
    assert _continue(inproc_stack, source, tmp_path) == {"continued_from": "src-1"}
    assert decode((tmp_path / RESTORE_FILE).read_bytes()).turns == 4


def test_a_continuation_without_a_checkpoint_is_refused_not_retried(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    source = _source(inproc_stack)
    gone = _continue(inproc_stack, source, tmp_path)  # named, but not in S3
    assert gone == {"refused": "the session checkpoint of task src-1 is gone from S3"}
    missing = _continue(inproc_stack, None, tmp_path)  # not found under this tenant
    assert missing["refused"].startswith("task src-1 was not found")
    assert not (tmp_path / RESTORE_FILE).exists()


def test_a_continuations_checkpoint_s3_keeps_refusing_is_retried(
    stack: Stack, tmp_path: Path
) -> None:
    source = _source(stack)
    _put(stack, checkpoint_key("acme", "src-1", 1), _checkpoint(2))
    s3 = _throttled_s3(stack, "GetObject")
    offered = _continue(stack, source, tmp_path, s3=s3)
    assert offered == {"unreadable": "checkpoint of task src-1 unreadable (ClientError)"}


def test_a_failed_last_upload_names_no_final_checkpoint(stack: Stack, tmp_path: Path) -> None:
    s3 = _Switch(stack.s3)
    first = _uploader(stack, tmp_path, [True], s3=s3)
    _write(tmp_path, _checkpoint(1))
    assert first.sync()
    s3.current = _throttled_s3(stack, "PutObject")
    _write(tmp_path, _checkpoint(2, "the final answer"))
    first.stop()  # botocore gave up on the whole checkpoint, then on a last part
    assert s3.puts == ["part-000001.jsonl", "session.jsonl", "part-000002.jsonl"]
    assert first.final_key is None  # its last turn is not in S3: not named as final
    s3.current = stack.s3
    second = _uploader(stack, tmp_path / "again", [True], s3=s3)
    _write(tmp_path / "again", _checkpoint(2, "the final answer"))
    second.stop()
    assert second.final_key == checkpoint_key("acme", "r-1", 1)
