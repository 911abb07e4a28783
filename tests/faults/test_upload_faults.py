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

from agentq import security
from agentq.faults.config import Kind
from worker.artifacts import upload_outputs
from worker.scrub import CHUNK_BYTES

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
