"""The worker's parts on their own: child runner, outcome table, env allowlist, batcher."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import wait_for

from agentq.definitions import TaskDefinition
from worker.child.env import child_environment
from worker.child.leasefile import SIGNALLED_MESSAGE
from worker.child.supervisor import ChildExit, StopSignal, run_child
from worker.settle.outcome import backoff_s, decide
from worker.sqs.batcher import SqsBatcher, clamp_visibility

pytestmark = pytest.mark.timeout(60)


def _task_dir(tmp_path: Path, callable_: str, payload: dict[str, Any], **extra: Any) -> Path:
    definition = TaskDefinition(name="t", kind="python", settings={"callable": callable_}, **extra)
    task = {"requestId": "r-1", "tenant": "acme", "attempt": 1, "jobId": None,
            "definition": definition.to_dict(), "input": payload}  # fmt: skip
    (tmp_path / "task.json").write_text(json.dumps(task))
    return tmp_path


def _child(task_dir: Path) -> int:
    return subprocess.run(
        [sys.executable, "-m", "worker.child", str(task_dir)],
        check=False,
        capture_output=True,
        timeout=30,
    ).returncode


def test_worker_child_writes_the_result_and_exits_0(tmp_path: Path) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:echo", {"a": 1})
    assert _child(task_dir) == 0
    assert json.loads((task_dir / "artifacts/task-result.json").read_text()) == {"a": 1}
    assert not (task_dir / "error.json").exists()


@pytest.mark.parametrize(
    ("callable_", "payload", "category", "retryable"),
    [
        ("agentq.samples:fail", {"category": "network"}, "network", True),
        ("agentq.samples:fail", {"category": "auth"}, "auth", False),
        ("agentq.samples:fail", {"category": "programming"}, "programming", False),
        ("agentq.samples:missing", {}, "not_found", False),
        ("agentq.no_such_module:run", {}, "not_found", False),
        ("not-a-callable-spec", {}, "validation", False),
    ],
)
def test_worker_child_writes_a_structured_error_record(
    tmp_path: Path, callable_: str, payload: dict[str, Any], category: str, retryable: bool
) -> None:
    task_dir = _task_dir(tmp_path, callable_, payload)
    assert _child(task_dir) == 1
    record = json.loads((task_dir / "error.json").read_text())
    assert record["category"] == category and record["retryable"] is retryable
    assert set(record) == {"category", "retryable", "message", "exception_type"}


def test_a_programming_error_leaves_its_traceback_in_the_attempt_logs(tmp_path: Path) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:fail",
                         {"category": "programming", "message": "bad key 'a'"})  # fmt: skip
    assert _child(task_dir) == 1
    text = (task_dir / "logs" / "traceback.txt").read_text()
    assert "Traceback (most recent call last)" in text and "TypeError: bad key 'a'" in text
    assert "agentq/samples/__init__.py" in text
    record = json.loads((task_dir / "error.json").read_text())
    assert record["message"].startswith("bad key 'a' (at __init__.py:")


def test_a_task_error_keeps_its_authors_message(tmp_path: Path) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:fail", {"category": "auth", "message": "m"})
    assert _child(task_dir) == 1
    assert json.loads((task_dir / "error.json").read_text())["message"] == "m"


def test_worker_outcome_follows_the_seed_table(tmp_path: Path) -> None:
    def child(code: int, stopped: Any = None) -> ChildExit:
        return ChildExit(returncode=code, duration_ms=5, stopped=stopped)

    assert decide(child(-9, "timeout"), tmp_path, attempt=1, max_attempts=3).verdict == "timeout"
    assert decide(child(1), tmp_path, attempt=1, max_attempts=3).error.category == "parse"  # type: ignore[union-attr]
    # Killed by a signal the worker did not send (OOM): retried, not failed for good.
    killed = decide(child(-9), tmp_path, attempt=1, max_attempts=3)
    assert killed.verdict == "retry"
    assert killed.error is not None and killed.error.category == "server"
    assert "SIGKILL" in killed.error.message
    assert decide(child(-9), tmp_path, attempt=3, max_attempts=3).verdict == "failed"
    (tmp_path / "error.json").write_text(json.dumps({"category": "server", "message": "x"}))
    assert decide(child(1), tmp_path, attempt=1, max_attempts=3).verdict == "retry"
    assert decide(child(1), tmp_path, attempt=3, max_attempts=3).verdict == "failed"
    # Exit 0 without a result breaks the protocol: not a success.
    assert decide(child(0), tmp_path, attempt=1, max_attempts=3).verdict == "failed"
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts/task-result.json").write_text("{}")
    assert decide(child(0), tmp_path, attempt=1, max_attempts=3).verdict == "completed"
    # Stopped over its lease after it had finished: the finalize (by token) decides.
    fenced = decide(child(0, "lease_lost"), tmp_path, attempt=1, max_attempts=3)
    assert fenced.fenced and fenced.verdict == "completed"


def test_a_fenced_attempt_without_a_result_is_retried_if_the_lease_is_still_ours(
    tmp_path: Path,
) -> None:
    stopped = ChildExit(returncode=-15, duration_ms=5, stopped="lease_lost")
    early = decide(stopped, tmp_path, attempt=1, max_attempts=3)
    assert early.fenced and early.verdict == "retry"
    assert early.error is not None and early.error.exception_type == "LeaseFenced"
    assert decide(stopped, tmp_path, attempt=3, max_attempts=3).verdict == "failed"


def test_an_attempt_fenced_before_its_child_started_is_released_even_on_its_last_attempt(
    tmp_path: Path,
) -> None:
    unstarted = ChildExit(returncode=0, duration_ms=0, stopped="lease_lost", started=False)
    outcome = decide(unstarted, tmp_path, attempt=1, max_attempts=1)
    assert (outcome.verdict, outcome.fenced) == ("released", True)
    assert outcome.error is not None and outcome.error.exception_type == "LeaseFenced"


def test_worker_backoff_grows_with_jitter_and_a_cap() -> None:
    for attempt in range(1, 12):
        delay = backoff_s(attempt, base_s=1, max_s=30)
        assert 1 <= delay <= min(30, 2 ** (attempt - 1))
    assert clamp_visibility(0.2) == 1 and clamp_visibility(10**6) == 43_200


def test_worker_child_env_is_an_allowlist() -> None:
    parent = {
        "PATH": "/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm",
        "AWS_ACCESS_KEY_ID": "AKIA...", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
        "AWS_ENDPOINT_URL": "http://moto", "AWS_REGION": "eu-west-1",
        "ANTHROPIC_API_KEY": "k", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "AGENTQ_LOCAL": "1", "TENANT_ID": "acme", "SQS_QUEUE_URL": "q", "SLACK_BOT_TOKEN": "x",
        "HOME": "/root",
    }  # fmt: skip
    env = child_environment(parent, home="/tmp/home")
    assert not [name for name in env if name.startswith("AWS_")]
    assert env["HOME"] == "/tmp/home"
    assert {"PATH", "LANG", "LC_ALL", "TERM", "ANTHROPIC_API_KEY", "AGENTQ_LOCAL",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "TENANT_ID"} <= set(env)  # fmt: skip
    assert "SQS_QUEUE_URL" not in env and "SLACK_BOT_TOKEN" not in env


def test_worker_supervisor_stop_signal_ends_the_child(tmp_path: Path) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:sleep", {"seconds": 30})
    stop = StopSignal()
    lines: list[str] = []
    started = threading.Event()

    def on_start(pid: int) -> None:
        started.set()

    result: list[ChildExit] = []
    runner = threading.Thread(
        target=lambda: result.append(
            run_child(task_dir, env=child_environment({"PATH": "/usr/bin:/bin"}, home=str(tmp_path)),
                      timeout_s=60, grace_s=0.5, stop=stop,
                      log_line=lambda s, line: lines.append(line), on_start=on_start)
        )
    )  # fmt: skip
    runner.start()
    assert started.wait(10)
    stop.set("lease_lost")
    runner.join(timeout=30)
    assert result and result[0].stopped == "lease_lost" and result[0].returncode != 0


def test_a_child_ended_by_a_signal_the_worker_did_not_send_is_logged_with_when(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its lease watchdog (or the kernel) SIGKILLs a child before its task code can record
    its end: the worker's line, with the pid and when the end was seen, is the record."""
    task_dir = _task_dir(tmp_path, "agentq.samples:sleep", {"seconds": 30})
    pids: list[int] = []
    started = threading.Event()

    def on_start(pid: int) -> None:
        pids.append(pid)
        started.set()

    result: list[ChildExit] = []
    runner = threading.Thread(
        target=lambda: result.append(
            run_child(task_dir, env=child_environment({"PATH": "/usr/bin:/bin"}, home=str(tmp_path)),
                      timeout_s=60, grace_s=0.5, stop=StopSignal(),
                      log_line=lambda s, line: None, on_start=on_start)
        )
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="worker.child.supervisor"):
        runner.start()
        assert started.wait(10)
        killed_at = time.time()
        os.kill(pids[0], signal.SIGKILL)
        runner.join(timeout=30)
        returned_at = time.time()
    assert result and result[0].stopped is None and result[0].returncode == -signal.SIGKILL
    records = [r for r in caplog.records if r.getMessage() == SIGNALLED_MESSAGE]
    assert len(records) == 1, caplog.text
    record = records[0].__dict__
    assert record["pid"] == pids[0] and record["signal"] == "SIGKILL"
    assert killed_at <= record["at"] <= returned_at


def test_a_child_that_fails_on_its_own_logs_no_signal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    task_dir = _task_dir(tmp_path, "agentq.samples:fail", {"category": "network"})
    with caplog.at_level(logging.WARNING, logger="worker.child.supervisor"):
        exit_ = run_child(task_dir, env=child_environment({"PATH": "/usr/bin:/bin"}, home=str(tmp_path)),
                          timeout_s=60, grace_s=0.5, stop=StopSignal(),
                          log_line=lambda s, line: None)  # fmt: skip
    assert exit_.returncode == 1 and exit_.stopped is None
    assert SIGNALLED_MESSAGE not in caplog.text


def test_worker_batcher_deletes_and_changes_visibility_in_batches(inproc_stack: Stack) -> None:
    sqs, url = inproc_stack.sqs, inproc_stack.resources.queue_url
    for n in range(15):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    handles: list[str] = []

    def received_all() -> bool:
        reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        handles.extend(m["ReceiptHandle"] for m in reply.get("Messages", []))
        return len(handles) >= 15

    wait_for(received_all, message="15 messages received")
    calls: list[str] = []
    sqs.meta.events.register("before-call.sqs", lambda model, **_: calls.append(model.name))
    batcher = SqsBatcher(sqs, url, delay_s=0.2)
    for handle in handles[:12]:
        batcher.delete(handle)
    for handle in handles[12:]:
        batcher.change_visibility(handle, 0)
    batcher.close()
    assert calls.count("DeleteMessageBatch") == 2
    assert calls.count("ChangeMessageVisibilityBatch") == 1
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "3"


def test_worker_renews_many_leases_in_one_transaction(inproc_stack: Stack) -> None:
    from agentq.envelope import TaskEnvelope
    from agentq.store.tasks import TaskStore

    tasks = TaskStore(inproc_stack.dynamodb, inproc_stack.resources.table_name)
    leases = [
        tasks.acquire(
            TaskEnvelope(request_id=f"r-{n}", tenant="acme", definition="sample-echo"),
            worker_id="w",
            lease_seconds=3,
            max_attempts=3,
        )
        for n in range(12)
    ]
    # r-3 was taken over by another worker: its token changed.
    inproc_stack.dynamodb.update_item(
        TableName=inproc_stack.resources.table_name,
        Key={"PK": {"S": "TASK#acme#r-3"}, "SK": {"S": "STATE"}},
        UpdateExpression="SET leaseToken = :t",
        ExpressionAttributeValues={":t": {"S": "other"}},
    )
    calls: list[str] = []
    inproc_stack.dynamodb.meta.events.register(
        "before-call.dynamodb", lambda model, **_: calls.append(model.name)
    )
    renewed, lost = tasks.renew_many(leases, lease_seconds=60)
    assert [lease.request_id for lease in lost] == ["r-3"]
    assert sorted(lease.request_id for lease in renewed) == sorted(
        f"r-{n}" for n in range(12) if n != 3
    )
    assert calls == ["TransactWriteItems", "TransactWriteItems"]
    record = tasks.get("acme", "r-5")
    assert record is not None and record.effective_until_ms == renewed[0].effective_until_ms
    assert all(lease.effective_until_ms > leases[0].effective_until_ms for lease in renewed)


def test_worker_heartbeat_gives_up_extending_after_three_failures(inproc_stack: Stack) -> None:
    from agentq.config import Settings
    from agentq.envelope import TaskEnvelope
    from agentq.publisher import EventPublisher
    from agentq.store.tasks import TaskStore
    from worker.heartbeat import Heartbeat
    from worker.inflight import InFlight, InFlightRegistry
    from worker.sqs.eventbatch import EventBatcher

    sqs, url = inproc_stack.sqs, inproc_stack.resources.queue_url
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    message = sqs.receive_message(QueueUrl=url)["Messages"][0]
    tasks = TaskStore(inproc_stack.dynamodb, inproc_stack.resources.table_name)
    envelope = TaskEnvelope(request_id="r-hb", tenant="acme", definition="sample-echo")
    good = InFlight(message_id=message["MessageId"], receipt_handle=message["ReceiptHandle"],
                    envelope=envelope)  # fmt: skip
    good.lease = tasks.acquire(envelope, worker_id="w", lease_seconds=3, max_attempts=3)
    bad = InFlight(message_id="gone", receipt_handle="not-a-receipt-handle")
    registry = InFlightRegistry()
    registry.add(good)
    registry.add(bad)
    publisher = EventPublisher(
        inproc_stack.events, bus_name=inproc_stack.resources.bus_name, source="agentq"
    )
    events = EventBatcher(publisher, delay_s=0)
    heartbeat = Heartbeat(
        settings=Settings.from_env(), sqs=sqs, store=tasks, publisher=events,
        inflight=registry, worker_id="w",
    )  # fmt: skip
    for _ in range(4):
        heartbeat.beat()
    events.close()
    assert bad.extending is False and bad.extension_failures == 3
    assert good.extending is True and good.extension_failures == 0
    assert good.lease is not None and good.lease.effective_until_ms > 0
    assert publisher.stats.entries == 4  # one heartbeat event per beat for the leased task


def test_event_batcher_runs_then_only_after_the_event_is_sent(inproc_stack: Stack) -> None:
    """The worker deletes a finished task's message through `then`: never before the
    terminal event is on the bus, and not at all when it could not be sent."""
    from agentq.events import task_event
    from agentq.publisher import EventPublisher
    from worker.sqs.eventbatch import EventBatcher

    class _Rejecting:
        def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
            return {"FailedEntryCount": len(Entries),
                    "Entries": [{"ErrorCode": "InternalFailure"}] * len(Entries)}  # fmt: skip

    sent: list[str] = []
    good = EventBatcher(
        EventPublisher(inproc_stack.events, bus_name=inproc_stack.resources.bus_name,
                       source="agentq"),
        delay_s=0,
    )  # fmt: skip
    done = task_event("Task Completed", request_id="r-ok", tenant="t")
    good.publish(done, then=lambda: sent.append("r-ok"))
    good.close()
    assert sent == ["r-ok"]

    bad = EventBatcher(
        EventPublisher(_Rejecting(), bus_name="b", source="agentq", max_attempts=2,
                       sleep=lambda _: None),
        delay_s=0,
    )  # fmt: skip
    bad.publish(task_event("Task Completed", request_id="r-lost", tenant="t"),
                then=lambda: sent.append("r-lost"))  # fmt: skip
    bad.close()
    assert sent == ["r-ok"]  # the message stays; its redelivery re-sends the event
