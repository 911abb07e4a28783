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
from conftest import Stack

from agentq import security
from agentq.aws import make_client, new_session
from agentq.envelope import TaskEnvelope
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.jobs import result_key
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION
from agentq.states import TaskState
from agentq.store import TaskRecord, TaskStore
from worker.child.files import read_usage
from worker.kinds.agent.checkpoint import (
    CHECKPOINT_FILE,
    RESTORE_FILE,
    Checkpoint,
    decode,
    encode,
)
from worker.settle.checkpoints import (
    CheckpointUploader,
    checkpoint_key,
    restore,
    restore_source,
    resumable,
)

SESSION = str(uuid.uuid4())


def _checkpoint(turns: int, text: str = "hello") -> bytes:
    entries = [{"type": "user", "message": {"role": "user", "content": text}}]
    return encode(Checkpoint(session_id=SESSION, turns=turns, entries=entries))


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


def test_a_retry_reads_the_newest_checkpoint_at_or_below_its_attempt(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    stack = inproc_stack
    _put(stack, checkpoint_key("acme", "r-1", 1), _checkpoint(1))
    # A later attempt's checkpoint (a newer holder's) is never taken by an older attempt.
    _put(stack, checkpoint_key("acme", "r-1", 3), _checkpoint(3))
    # Another tenant's task of the same id is never read.
    _put(stack, checkpoint_key("zeta", "r-1", 2), _checkpoint(9))

    assert _restore(stack, 2, tmp_path / "a2") == {"from_attempt": 1}
    assert decode((tmp_path / "a2" / RESTORE_FILE).read_bytes()).turns == 1
    assert _restore(stack, 5, tmp_path / "a5") == {"from_attempt": 3}
    assert decode((tmp_path / "a5" / RESTORE_FILE).read_bytes()).turns == 3
    # An attempt given back at a drain keeps its number: its own checkpoint is its resume.
    assert _restore(stack, 3, tmp_path / "a3") == {"from_attempt": 3}


def test_no_checkpoint_is_no_resume(inproc_stack: Stack, tmp_path: Path) -> None:
    assert _restore(inproc_stack, 3, tmp_path) is None
    assert not (tmp_path / RESTORE_FILE).exists()


def _always_throttled_s3(stack: Stack) -> Any:
    """An S3 client whose every GetObject is throttled. Two attempts, not agentq's ten:
    the same story (botocore retried, then gave up), sooner."""
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    s3 = session.client("s3", endpoint_url=stack.resources.endpoint_for("s3"),
                        config=Config(retries={"mode": "standard", "max_attempts": 2}))  # fmt: skip
    throttled = FaultRule(op="s3:GetObject", kind=Kind.THROTTLE, rate=1.0)
    install(s3, FaultInjector(FaultSpec(rules=(throttled,)), seed=3))
    return s3


def test_a_checkpoint_s3_keeps_refusing_is_a_fresh_start_not_a_failure(
    stack: Stack, tmp_path: Path
) -> None:
    _put(stack, checkpoint_key("acme", "r-1", 1), _checkpoint(2))
    s3 = _always_throttled_s3(stack)

    offered = _restore(stack, 2, tmp_path, s3=s3)

    assert offered == {"unreadable": "checkpoint of attempt 2 unreadable (ClientError)"}
    assert not (tmp_path / RESTORE_FILE).exists()


def _uploader(stack: Stack, task_dir: Path, allowed: list[bool], s3: Any = None) -> Any:
    return CheckpointUploader(
        s3 or stack.s3, stack.resources.bucket, checkpoint_key("acme", "r-1", 1), task_dir,
        interval_s=3600, allowed=lambda: allowed[0],
    )  # fmt: skip


def _write(task_dir: Path, data: bytes) -> None:
    path = task_dir / CHECKPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name("partial")
    partial.write_bytes(data)
    partial.replace(path)  # as the child writes it


def _stored(stack: Stack) -> bytes:
    key = checkpoint_key("acme", "r-1", 1)
    body = stack.s3.get_object(Bucket=stack.resources.bucket, Key=key)["Body"]
    return bytes(body.read())


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


def test_the_uploaded_transcript_is_scrubbed_of_the_workers_secrets(
    inproc_stack: Stack, tmp_path: Path
) -> None:
    secret = "sk-ant-api03-" + "q" * 40
    security.remember_environment({"ANTHROPIC_API_KEY": secret})
    try:
        _write(tmp_path, _checkpoint(1, f"the key is {secret}"))
        assert _uploader(inproc_stack, tmp_path, [True]).sync()
    finally:
        security.remember_environment({})
    stored = _stored(inproc_stack)
    assert secret.encode() not in stored
    (entry,) = decode(stored).entries
    assert entry["message"]["content"] == f"the key is {security.REDACTED}"


def test_nothing_is_uploaded_once_the_lease_is_lost(inproc_stack: Stack, tmp_path: Path) -> None:
    allowed = [True]
    uploader = _uploader(inproc_stack, tmp_path, allowed).start()
    _write(tmp_path, _checkpoint(1))
    assert uploader.sync()
    allowed[0] = False
    _write(tmp_path, _checkpoint(2, "after the lease"))
    uploader.stop()  # its last pass too
    assert decode(_stored(inproc_stack)).turns == 1


def test_the_last_pass_at_stop_uploads_the_final_turn(inproc_stack: Stack, tmp_path: Path) -> None:
    uploader = _uploader(inproc_stack, tmp_path, [True]).start()
    _write(tmp_path, _checkpoint(4))
    uploader.stop()
    assert decode(_stored(inproc_stack)).turns == 4


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
    s3 = _always_throttled_s3(stack)
    offered = _continue(stack, source, tmp_path, s3=s3)
    assert offered == {"unreadable": "checkpoint of task src-1 unreadable (ClientError)"}


def test_a_failed_last_upload_names_no_final_checkpoint(stack: Stack, tmp_path: Path) -> None:
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    failing = session.client("s3", endpoint_url=stack.resources.endpoint_for("s3"),
                             config=Config(retries={"mode": "standard", "max_attempts": 2}))  # fmt: skip
    throttled = FaultRule(op="s3:PutObject", kind=Kind.THROTTLE, rate=1.0)
    install(failing, FaultInjector(FaultSpec(rules=(throttled,)), seed=3))
    s3 = [stack.s3]

    class Switch:  # the uploader's S3, throttled from the second upload on
        def put_object(self, **kwargs: Any) -> Any:
            return s3[0].put_object(**kwargs)

    uploader = _uploader(stack, tmp_path, [True], s3=Switch())
    _write(tmp_path, _checkpoint(1))
    assert uploader.sync() and uploader.final_key == checkpoint_key("acme", "r-1", 1)
    s3[0] = failing
    _write(tmp_path, _checkpoint(2, "the final answer"))
    assert uploader.sync() is False  # botocore gave up
    assert uploader.final_key is None  # its last turn is not in S3: not named as final
    s3[0] = stack.s3
    assert uploader.sync() and uploader.final_key is not None
