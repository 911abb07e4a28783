"""dlq-processor and redrive: dead letters are archived, closed out once, and replayable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from conftest import Stack
from dlq_support import dead_letter as _dead_letter
from dlq_support import dlq_event as _dlq_event
from dlq_support import envelope_of as _envelope
from dlq_support import tasks_of as _tasks
from support import EventLog, wait_for

from agentq.cli import main as cli
from agentq.config import Settings
from agentq.dlq import DLQ_REASON, DlqArchive
from agentq.envelope import TaskEnvelope
from agentq.events import now_ms, task_event
from agentq.local.lambda_host import LambdaHost, local_context
from agentq.local.workers import WorkerProcess, fast_env
from agentq.states import TaskState
from agentq.store import EventStore
from lambdas import dlq_processor

pytestmark = pytest.mark.timeout(180)


def test_a_message_that_failed_three_times_ends_failed_with_one_event(stack: Stack) -> None:
    envelope = _envelope("r-dlq-1")
    _dead_letter(stack, envelope)
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")

    # The Lambda host plays the Lambda service: DLQ → dlq-processor, bus → save-event.
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0):
        record = wait_for(
            lambda: (r := _tasks(stack).get("acme", "r-dlq-1")) and r.state.terminal and r,
            timeout=60, message="the task closed out",
        )  # fmt: skip
        failed = wait_for(
            lambda: [e for e in events.timeline("acme", "r-dlq-1")
                     if e["detailType"] == "Task Failed"],
            timeout=60, message="Task Failed in the table",
        )  # fmt: skip

    assert record.state is TaskState.FAILED
    assert record.raw["error"]["message"] == DLQ_REASON
    assert record.attempt == 3
    assert len(failed) == 1
    assert failed[0]["payload"]["error"]["message"] == DLQ_REASON
    assert failed[0]["attempt"] == 3
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "failed"
    assert json.loads(archived.body) == envelope.to_dict()
    assert archived.attributes["requestId"]["StringValue"] == "r-dlq-1"
    assert int(archived.system_attributes["ApproximateReceiveCount"]) >= 3


def test_redelivered_dead_letter_emits_nothing_new(stack: Stack) -> None:
    _dead_letter(stack, _envelope("r-dlq-twice"))
    event = _dlq_event(stack)
    ctx = local_context("dlq-processor")

    first = dlq_processor.handler(event, ctx)
    second = dlq_processor.handler(event, ctx)  # the same batch delivered again

    assert first == second == {"batchItemFailures": []}
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "already-terminal"  # the second pass found it FAILED
    assert _tasks(stack).require("acme", "r-dlq-twice").state is TaskState.FAILED


def test_an_already_completed_task_is_not_overwritten(stack: Stack) -> None:
    envelope = _envelope("r-dlq-done")
    _dead_letter(stack, envelope, crash=False)
    tasks = _tasks(stack)
    lease = tasks.acquire(envelope, worker_id="w-1", lease_seconds=30, max_attempts=3)
    tasks.finalize(lease, TaskState.COMPLETED, fields={"result": {"ok": True}})

    assert dlq_processor.handler(_dlq_event(stack), local_context("dlq")) == {
        "batchItemFailures": []
    }

    record = tasks.require("acme", "r-dlq-done")
    assert record.state is TaskState.COMPLETED
    assert "error" not in record.raw
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "already-terminal"


def test_a_finished_task_whose_event_was_lost_gets_it_from_the_dead_letter(
    stack: Stack,
) -> None:
    """A worker finalized the task (the event stored on the STATE item) and died before
    sending it; the message ran out of receives. The DLQ processor sends the stored event."""
    envelope = _envelope("r-dlq-lost-event")
    _dead_letter(stack, envelope, crash=False)
    tasks = _tasks(stack)
    lease = tasks.acquire(envelope, worker_id="w-1", lease_seconds=30, max_attempts=3)
    stored = task_event("Task Completed", request_id=envelope.request_id,
                        tenant=envelope.tenant, attempt=lease.attempt, worker_id="w-1")  # fmt: skip
    tasks.finalize(lease, TaskState.COMPLETED, fields={"terminalEvent": stored.to_detail()})
    events = EventLog(stack)

    assert dlq_processor.handler(_dlq_event(stack), local_context("dlq")) == {
        "batchItemFailures": []
    }

    (sent,) = events.wait(envelope.request_id, "Task Completed", timeout=30)
    assert sent["eventId"] == stored.event_id, "the same event, not a second ending"
    assert _tasks(stack).require("acme", envelope.request_id).state is TaskState.COMPLETED
    assert not events.of(envelope.request_id, "Task Failed")


def test_a_live_lease_is_left_to_its_holder_until_it_lapses(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The holder may die before it settles the task (a prefetched lock, a kill): the
    record is failed so SQS brings it back, and once the lease lapsed it is closed out."""
    envelope = _envelope("r-dlq-live")
    _dead_letter(stack, envelope, crash=False)
    # Its last attempt: once the lease lapsed, no attempt is left to return it for.
    # A lease long enough to stay live through the first invocation on a slow machine
    # (2 s lapsed before it on a loaded CI run); shortened below to let it lapse.
    lease = _tasks(stack).acquire(envelope, worker_id="w-live", lease_seconds=30, max_attempts=1)
    event = _dlq_event(stack)

    # A wait is a per-record retry, not an error of the function, even when it is the
    # whole batch: its Errors alarm must not fire on a normal wait.
    (record,) = event["Records"]
    assert dlq_processor.handler(event, local_context("dlq")) == {
        "batchItemFailures": [{"itemIdentifier": record["messageId"]}]
    }
    waits = [m for m in _metric_lines(capsys.readouterr().out) if dlq_processor.WAIT_METRIC in m]
    (waited,) = waits[0][dlq_processor.WAIT_METRIC]  # EMF lists a metric's values
    assert len(waits) == 1 and waited >= 0

    assert _tasks(stack).require("acme", "r-dlq-live").state is TaskState.PROCESSING
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert archived.outcome == "lease-live"

    lease = _tasks(stack).renew(lease, lease_seconds=0.05)
    wait_for(lambda: now_ms() > lease.effective_until_ms, timeout=10, message="lease lapse")
    assert dlq_processor.handler(event, local_context("dlq")) == {"batchItemFailures": []}
    assert _tasks(stack).require("acme", "r-dlq-live").state is TaskState.FAILED


def test_a_lease_that_lapses_after_the_read_leaves_the_task_to_be_returned(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read while its holder's lease is live (no return: not waiting yet), the lease then
    lapses before the close-out's write: the task still has attempts, so it must not be
    failed; it waits, and the next look returns it."""
    envelope = _envelope("r-dlq-race")
    _dead_letter(stack, envelope, crash=False)
    lease = _tasks(stack).acquire(envelope, worker_id="w-race", lease_seconds=30, max_attempts=3)
    event = _dlq_event(stack)
    import agentq.store.transitions as transitions

    # The close-out's conditional write runs after the lease's end, as on a loaded host.
    later = lease.effective_until_ms + 1_000
    monkeypatch.setattr(transitions, "now_ms", lambda: later)
    (record,) = event["Records"]
    assert dlq_processor.handler(event, local_context("dlq")) == {
        "batchItemFailures": [{"itemIdentifier": record["messageId"]}]
    }
    assert _tasks(stack).require("acme", "r-dlq-race").state is TaskState.PROCESSING


def _metric_lines(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if "_aws" in line]


def test_a_batch_of_waits_and_real_failures_fails_the_invocation(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waits do not hide a real failure: with no record done, the function errs."""
    held = _envelope("r-dlq-held")
    _dead_letter(stack, held, crash=False)
    _tasks(stack).acquire(held, worker_id="w-live", lease_seconds=60, max_attempts=1)
    event = _dlq_event(stack)
    assert dlq_processor.handler(event, local_context("dlq"))["batchItemFailures"]
    monkeypatch.setenv("S3_BUCKET", "no-such-bucket")  # archiving now fails for real

    with pytest.raises(BatchProcessingError):
        dlq_processor.handler(event, local_context("dlq"))


def test_waited_seconds_reads_the_first_send_time() -> None:
    record = {"attributes": {"SentTimestamp": "1000000"}}
    assert dlq_processor.waited_seconds(record, now_s=1060.5) == 60.5
    assert dlq_processor.waited_seconds({"attributes": {}}, now_s=1.0) == 0.0


def test_malformed_dead_letter_is_archived_and_not_retried(stack: Stack) -> None:
    stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody="{not json")

    response = dlq_processor.handler(_dlq_event(stack), local_context("dlq"))

    assert response == {"batchItemFailures": []}
    (archived,) = DlqArchive(stack.s3, stack.resources.bucket).list()
    assert (archived.outcome, archived.body) == ("malformed", "{not json")


def test_nothing_is_closed_out_unless_archived(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dead_letter(stack, _envelope("r-dlq-infra"))
    event = _dlq_event(stack)
    monkeypatch.setenv("S3_BUCKET", "no-such-bucket")  # archiving is the first step

    # Every record failed: Powertools raises so the Lambda service retries the batch.
    with pytest.raises(BatchProcessingError):
        dlq_processor.handler(event, local_context("dlq"))

    record = _tasks(stack).require("acme", "r-dlq-infra")
    assert record.state is TaskState.PROCESSING  # untouched until it can be archived


def test_redrive_replays_the_message_with_a_fresh_attempt_budget(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = _envelope("r-dlq-redrive")
    _dead_letter(stack, envelope)
    dlq_processor.handler(_dlq_event(stack), local_context("dlq"))
    assert _tasks(stack).require("acme", "r-dlq-redrive").state is TaskState.FAILED
    capsys.readouterr()  # the handler's log and metric lines

    assert cli(["dlq", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["archived"]
    assert [(m["request_id"], m["outcome"]) for m in listed] == [("r-dlq-redrive", "failed")]

    assert cli(["dlq", "redrive", "r-dlq-redrive", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["outcome"] == "redriven"

    record = _tasks(stack).require("acme", "r-dlq-redrive")
    assert (record.state, record.attempt) == (TaskState.PENDING, 0)
    got = stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, WaitTimeSeconds=5, MessageAttributeNames=["All"]
    )["Messages"]
    assert json.loads(got[0]["Body"]) == envelope.to_dict()
    assert got[0]["MessageAttributes"]["requestId"]["StringValue"] == "r-dlq-redrive"
    # The replay's attempt budget is fresh: a worker may lock it again.
    tasks = _tasks(stack)
    lease = tasks.acquire(envelope, worker_id="w-2", lease_seconds=30, max_attempts=3)
    assert lease.attempt == 1

    # A second redrive finds nothing left to replay.
    assert cli(["dlq", "redrive", "r-dlq-redrive"]) == 3
    assert cli(["dlq", "redrive", "--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == []


def test_redrive_never_reruns_a_completed_task(stack: Stack) -> None:
    envelope = _envelope("r-dlq-norerun")
    _dead_letter(stack, envelope)
    dlq_processor.handler(_dlq_event(stack), local_context("dlq"))
    # Someone completed it meanwhile (e.g. a late worker): the archive stays, no replay.
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name,
        Key={"PK": {"S": "TASK#acme#r-dlq-norerun"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET #s = :c", ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":c": {"S": "COMPLETED"}},
    )  # fmt: skip

    assert cli(["dlq", "redrive", "r-dlq-norerun"]) == 1
    assert "Messages" not in stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, WaitTimeSeconds=1
    )


@pytest.mark.e2e
def test_a_redriven_task_runs_again_to_completion_on_a_worker(stack: Stack, tmp_path: Path) -> None:
    envelope = TaskEnvelope(request_id="r-dlq-rerun", tenant="acme", definition="sample-echo",
                            input={"text": "again"})  # fmt: skip
    _dead_letter(stack, envelope)
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    worker = WorkerProcess("redrive-worker", log_dir=tmp_path)
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0):
        wait_for(
            lambda: _tasks(stack).require("acme", "r-dlq-rerun").state is TaskState.FAILED,
            timeout=60, message="the dead letter closed out",
        )  # fmt: skip
        assert cli(["dlq", "redrive", "r-dlq-rerun"]) == 0
        worker.start({**stack.env(), **fast_env()})
        try:
            record = wait_for(
                lambda: (r := _tasks(stack).require("acme", "r-dlq-rerun")).state.terminal and r,
                timeout=90, message="the redriven task finished",
            )  # fmt: skip
            completed = wait_for(
                lambda: [e for e in events.timeline("acme", "r-dlq-rerun")
                         if e["detailType"] == "Task Completed"],
                timeout=60, message="Task Completed in the table",
            )  # fmt: skip
        finally:
            worker.stop(timeout=30)

    assert record.state is TaskState.COMPLETED, worker.output()[-3000:]
    assert record.attempt == 1  # the fresh budget: first attempt after the replay
    assert len(completed) == 1
    kinds = [e["detailType"] for e in events.timeline("acme", "r-dlq-rerun")]
    assert kinds.index("Task Failed") < kinds.index("Task Completed")


def test_a_dead_letter_without_a_state_item_is_returned_once_counted(stack: Stack) -> None:
    """A producer that skipped writing the STATE item: the processor creates it; the
    task never ran, so its message goes back to the task queue (it used to fail)."""
    _dead_letter(stack, _envelope("r-dlq-nostate"), crash=False, create=False)
    event = _dlq_event(stack)

    dlq_processor.handler(event, local_context("dlq"))
    dlq_processor.handler(event, local_context("dlq"))  # the same dead letter again

    record = _tasks(stack).require("acme", "r-dlq-nostate")
    assert (record.state, record.attempt, record.raw["dlqReturns"]) == (TaskState.PENDING, 0, 1)
    outcomes = sorted(m.outcome for m in DlqArchive(stack.s3, stack.resources.bucket).list())
    assert outcomes == ["returned"]  # same message id: the second pass overwrote it


def test_dlq_list_peeks_at_messages_not_yet_processed(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = _envelope("r-dlq-peek")
    stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody=envelope.to_body(),
                           MessageAttributes=envelope.message_attributes())  # fmt: skip

    assert cli(["dlq", "list", "--peek"]) == 0
    out = capsys.readouterr().out
    assert "no archived dead letters" in out
    assert "1 message(s) waiting in the DLQ" in out
    assert "requestId=r-dlq-peek" in out
    assert cli(["dlq", "redrive", "bad id!"]) == 6  # invalid input, nothing touched
