"""An output file's upload under S3 faults: the scrubbed temporary file is the request
body, and botocore rewinds it for each retry, so the object holds the whole scrubbed
file whether the first PutObject was throttled, cut off or applied with its answer lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Stack
from fault_support import Attempts, faulty_client, injector, rule
from worker_parts import LONG_LEASE, send_and_receive, worker_parts

from agentq import security
from agentq.faults.config import Kind
from agentq.states import TaskState
from worker.settle.artifacts import upload_outputs
from worker.settle.scrub import CHUNK_BYTES

SECRET = "planted-upload-secret-0123456789"


@pytest.fixture(autouse=True)
def remembered() -> Iterator[None]:
    security.remember_environment({"UPLOAD_TEST_TOKEN": SECRET})
    yield
    security.remember_environment({})


@pytest.mark.parametrize("kind", [Kind.THROTTLE, Kind.CONNECTION_RESET, Kind.APPLIED_THEN_FAILED])
def test_a_retried_upload_sends_the_whole_scrubbed_file(
    stack: Stack, tmp_path: Path, kind: Kind
) -> None:
    task_dir = tmp_path / "task"
    (task_dir / "artifacts").mkdir(parents=True)
    # Over two chunks, with the secret across the first chunk boundary.
    head = os.urandom(CHUNK_BYTES - 5)
    content = head + SECRET.encode() + os.urandom(CHUNK_BYTES + 333) + SECRET.encode()
    (task_dir / "artifacts" / "big.bin").write_bytes(content)
    attempts = Attempts()
    s3 = attempts.attach(faulty_client(stack, "s3", injector(rule("s3:PutObject", kind, limit=1))))

    keys = upload_outputs(s3, stack.resources.bucket, "task/acme/r1/attempt-1/", task_dir)

    assert keys == ["task/acme/r1/attempt-1/artifacts/big.bin"]
    assert attempts.counts["PutObject"] == 2  # the fault, then botocore's retry
    stored = stack.s3.get_object(Bucket=stack.resources.bucket, Key=keys[0])["Body"].read()
    assert stored == security.redact_known_bytes(content)
    assert SECRET.encode() not in stored
    assert stored.startswith(head + security.REDACTED.encode())


@pytest.mark.timeout(180)
def test_a_finished_task_whose_outputs_cannot_be_stored_is_retried_not_completed(
    stack: Stack,
) -> None:
    """Every PutObject fails (after botocore's retries): the child finished, but its
    result is not in S3, so COMPLETED would name nothing. The attempt fails retryably;
    the message stays for the retry."""
    s3 = faulty_client(stack, "s3", injector(rule("s3:PutObject", Kind.SERVER_ERROR)))
    parts = worker_parts(stack, s3=s3, env=LONG_LEASE)
    envelope, message, entry = send_and_receive(stack, "sample-echo")
    parts.inflight.add(entry)

    verdict = parts.handler.handle(message, entry=entry)
    assert parts.batcher.flush()

    assert verdict == "retrying"
    record = parts.store.require("acme", envelope.request_id)
    assert record.state is TaskState.RETRYING
    assert "result" not in record.raw
    assert record.raw["error"]["category"] == "server" and record.raw["error"]["retryable"]
    assert parts.sink.of("Task Completed") == []
    assert [e.detail_type for e in parts.sink.events][-1] == "Task Processing Failed"
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket,
                                      Prefix=f"task/acme/{envelope.request_id}/")  # fmt: skip
    assert listed.get("KeyCount", 0) == 0
