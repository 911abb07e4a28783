"""Reading a task's conversation from S3 (`TaskOutputs.conversation`): every attempt's
checkpoint in order, and what S3 faults and oversized checkpoints leave of the view.
Real boto3 against moto; faults injected into botocore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from conftest import Stack

from agentq import task_outputs
from agentq.aws import new_session
from agentq.faults.config import FaultRule, FaultSpec, Kind
from agentq.faults.injector import FaultInjector, install
from agentq.jobs import ResultReader
from agentq.local.aws import LOCAL_CREDENTIALS, LOCAL_REGION
from agentq.states import TaskState
from agentq.store import TaskRecord
from agentq.store.keys import checkpoint_key
from agentq.task_outputs import TaskOutputs

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures"


def _record(attempt: int, state: TaskState = TaskState.COMPLETED) -> TaskRecord:
    return TaskRecord(request_id="r-1", tenant="acme", state=state, attempt=attempt,
                      definition="chat", job_id=None, owner=None, lease_token=None,
                      effective_until_ms=None, created_at_ms=None, updated_at_ms=None,
                      raw={})  # fmt: skip


def _outputs(stack: Stack, s3: Any = None) -> TaskOutputs:
    return TaskOutputs(s3 or stack.s3, ResultReader(stack.s3, stack.resources.bucket))


def _put_fixtures(stack: Stack) -> None:
    for attempt in (1, 2):
        stack.s3.put_object(Bucket=stack.resources.bucket,
                            Key=checkpoint_key("acme", "r-1", attempt),
                            Body=(FIXTURES / f"resumed-attempt-{attempt}.jsonl").read_bytes())  # fmt: skip


def test_an_attempt_without_a_checkpoint_is_said_and_the_others_shown(stack: Stack) -> None:
    _put_fixtures(stack)
    conversation = _outputs(stack).conversation(_record(3), transcripts=True, resume_on=True)
    assert [(a.attempt, a.turns, a.problem) for a in conversation.attempts] == [
        (1, 5, None), (2, 5, None), (3, 0, "no checkpoint"),
    ]  # fmt: skip
    assert conversation.note is None


def test_s3_refusing_every_read_leaves_a_view_that_says_so(stack: Stack) -> None:
    _put_fixtures(stack)
    session = new_session(LOCAL_REGION, access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    s3 = session.client("s3", endpoint_url=stack.resources.endpoint_for("s3"),
                        config=Config(retries={"mode": "standard", "max_attempts": 2}))  # fmt: skip
    install(s3, FaultInjector(FaultSpec(rules=(
        FaultRule(op="s3:GetObject", kind=Kind.THROTTLE, rate=1.0),)), seed=3))  # fmt: skip

    conversation = _outputs(stack, s3).conversation(_record(2), transcripts=True, resume_on=True)
    assert conversation.turns == []
    assert conversation.note == "no checkpoint readable (unreadable (ClientError))"


def test_an_oversized_checkpoint_shows_its_beginning_and_says_it_was_cut(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_fixtures(stack)
    size = len((FIXTURES / "resumed-attempt-2.jsonl").read_bytes())
    monkeypatch.setattr(task_outputs, "MAX_CONVERSATION_BYTES", size // 2)
    conversation = _outputs(stack).conversation(_record(2), transcripts=True, resume_on=True)
    second = conversation.attempts[1]
    assert second.problem == f"only its first {size // 2} of {size} bytes read"
    assert conversation.skipped_lines >= 1  # the line the cut went through
    assert conversation.turns  # what was read is shown


def test_a_tenant_without_transcripts_and_a_live_task_say_why_nothing_shows(
    stack: Stack,
) -> None:
    _put_fixtures(stack)
    outputs = _outputs(stack)
    hushed = outputs.conversation(_record(2), transcripts=False, resume_on=True)
    assert hushed.turns == [] and "tenant acme does not store transcripts" in str(hushed.note)
    early = outputs.conversation(
        TaskRecord(**{**_record(1).__dict__, "request_id": "r-2", "state": TaskState.PROCESSING}),
        transcripts=None, resume_on=None,
    )  # fmt: skip
    assert early.note == "no checkpoint yet"
