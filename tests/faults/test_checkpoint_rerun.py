"""An attempt number run a second time (an operator's retry or a DLQ redrive gives the task
a fresh budget, so attempt 1 runs again over the earlier run's checkpoint): the new run
numbers its parts past the earlier run's, and a reader takes them over its stale whole
checkpoint, even when the new run dies before it can put its own."""

from __future__ import annotations

import uuid
from pathlib import Path

from conftest import Stack
from fault_support import unique_seed
from worker_parts import LONG_LEASE, worker_parts

from agentq.checkpoints import (
    SNAPSHOT_EVERY,
    Checkpoint,
    Part,
    decode,
    encode,
    encode_part,
    encode_whole,
    part_key,
    read_attempt,
    split,
)
from agentq.definitions import TaskDefinition
from agentq.envelope import TaskEnvelope
from worker.inflight import InFlight
from worker.kinds.agent.checkpoint import CHECKPOINT_FILE
from worker.settle.checkpoints import checkpoint_key

SESSION = str(uuid.uuid4())


def _transcript(entries: int) -> bytes:
    rows = [{"type": "user", "message": {"content": f"entry {n}"}} for n in range(entries)]
    return encode(Checkpoint(session_id=SESSION, turns=entries, entries=rows))


def test_an_attempt_run_again_numbers_its_parts_past_the_earlier_runs_and_they_win(
    stack: Stack, tmp_path: Path
) -> None:
    parts = worker_parts(stack, env={**LONG_LEASE, "AGENT_CHECKPOINT_INTERVAL": "3600000"})
    envelope = TaskEnvelope(request_id="rr-" + unique_seed(), tenant="acme", definition="long")
    definition = TaskDefinition.model_validate(
        {"name": "long", "kind": "agent", "settings": {"resume": True}}
    )
    bucket, rid = stack.resources.bucket, envelope.request_id
    # The earlier run of attempt 1: parts 1 and 2, then its whole checkpoint at its end.
    earlier = split(_transcript(3))
    for number, first in ((1, 0), (2, 2)):
        part = Part(session_id=SESSION, turns=number + 1, first_entry=first,
                    lines=earlier.lines[first : first + 2])  # fmt: skip
        stack.s3.put_object(Bucket=bucket, Key=part_key("acme", rid, 1, number),
                            Body=encode_part(part))  # fmt: skip
    stack.s3.put_object(Bucket=bucket, Key=checkpoint_key("acme", rid, 1),
                        Body=encode_whole(earlier, parts=2))  # fmt: skip

    lease = parts.store.acquire(envelope, worker_id="w1", lease_seconds=30, max_attempts=3)
    assert lease is not None and lease.attempt == 1
    task_dir, offered = parts.handler._write_task(envelope, definition, lease)
    assert offered == {"from_attempt": 1, "parts": 2}
    entry = InFlight(message_id="m-1", receipt_handle="r-1")
    uploader = parts.handler._checkpoints(envelope, definition, lease, task_dir, entry, offered)
    assert uploader is not None
    try:
        # The new run goes two entries further; its worker dies before the attempt ends.
        (task_dir / CHECKPOINT_FILE).parent.mkdir(parents=True, exist_ok=True)
        (task_dir / CHECKPOINT_FILE).write_bytes(_transcript(5))
        assert uploader.sync()
        found = read_attempt(stack.s3, bucket, "acme", rid, 1)
    finally:
        uploader.stop()

    # Its first part is a snapshot at the next snapshot number, the earlier parts intact;
    # the retry of attempt 2 resumes from the new run's five entries, not the stale three.
    first = stack.s3.get_object(Bucket=bucket, Key=part_key("acme", rid, 1, SNAPSHOT_EVERY + 1))
    assert first["ContentLength"] > 0
    kept = stack.s3.get_object(Bucket=bucket, Key=part_key("acme", rid, 1, 2))["Body"].read()
    assert kept == encode_part(Part(session_id=SESSION, turns=3, first_entry=2,
                                    lines=earlier.lines[2:4]))  # fmt: skip
    assert found is not None and found.parts == SNAPSHOT_EVERY + 1
    assert decode(found.data).entries == decode(_transcript(5)).entries
