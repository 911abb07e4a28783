"""The local Lambda host: EventBridge → target queue → host → the real handlers."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from conftest import Stack
from dlq_support import dead_letter, envelope_of, tasks_of
from support import wait_for

from agentq.config import Settings
from agentq.errors import ConfigError
from agentq.events import task_event
from agentq.local.lambda_host import LambdaHost, batch_failures
from agentq.publisher import EventPublisher
from agentq.states import TaskState
from agentq.store import EventStore

pytestmark = pytest.mark.timeout(120)


def _publisher(stack: Stack) -> EventPublisher:
    return EventPublisher(stack.events, bus_name=stack.resources.bus_name, source="agentq",
                          s3_client=stack.s3, bucket=stack.resources.bucket)  # fmt: skip


def test_a_worker_event_reaches_the_table_through_the_local_stack(stack: Stack) -> None:
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    started = task_event("Task Processing Started", request_id="r-host", tenant="acme",
                         attempt=1, worker_id="w-1", effective_until_ms=1_900_000_000_000)  # fmt: skip
    big = task_event("Task Completed", request_id="r-host", tenant="acme", attempt=1,
                     result={"text": "x" * 300_000})  # fmt: skip
    big = dataclasses.replace(big, timestamp_ms=started.timestamp_ms + 1)
    threads_before = threading.active_count()

    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs,
                    health_interval_s=0) as host:  # fmt: skip
        _publisher(stack).publish(started, big)
        timeline = wait_for(
            lambda: (t := events.timeline("acme", "r-host")) and len(t) == 2 and t,
            timeout=60, message="both events in the table",
        )  # fmt: skip
        assert host.invocations["save-event"] == 2

    assert [e["eventId"] for e in timeline] == [started.event_id, big.event_id]
    assert timeline[1]["payloadPointer"]["key"].startswith("events/overflow/")
    # stop() joined every poller: nothing keeps running after the host.
    assert threading.active_count() <= threads_before


def test_the_timer_runs_the_health_check(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs,
                    health_interval_s=0.2, serve_dlq=False) as host:  # fmt: skip
        wait_for(lambda: host.invocations["health-check"] >= 2, timeout=30,
                 message="two health checks")  # fmt: skip
    assert host.errors["health-check"] == 0


def test_the_host_refuses_an_environment_pointing_elsewhere(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNAMODB_EVENTS_TABLE_NAME", "some-other-table")
    with pytest.raises(ConfigError, match="DYNAMODB_EVENTS_TABLE_NAME"):
        LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs).start()


@pytest.mark.parametrize(
    ("response", "failed"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": None}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "m-2"}]}, {"m-2"}),
        ({"batchItemFailures": [{"itemIdentifier": "m-9"}]}, None),  # not of this batch
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": None}]}, None),
        ({"batchItemFailures": [{"id": "m-1"}]}, None),  # a bad key name
        ("not an object", None),
    ],
)
def test_a_partial_batch_response_is_judged_as_lambda_judges_it(
    response: object, failed: set[str] | None
) -> None:
    assert batch_failures(response, ["m-1", "m-2"]) == failed


def test_a_dead_letter_waiting_on_a_live_lease_is_no_function_error(stack: Stack) -> None:
    """The waiting record comes back for another look; the invocation did not fail."""
    envelope = envelope_of("r-host-held")
    dead_letter(stack, envelope, crash=False)
    tasks_of(stack).acquire(envelope, worker_id="w-live", lease_seconds=120, max_attempts=1)

    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                    only="dlq-processor") as host:  # fmt: skip
        wait_for(lambda: host.invocations["dlq-processor"] >= 2, timeout=60,
                 message="the waiting record looked at again")  # fmt: skip

    assert host.errors["dlq-processor"] == 0
    assert tasks_of(stack).require("acme", "r-host-held").state is TaskState.PROCESSING
