"""health-check against a local Slack Web API stand-in (real slack-sdk, real HTTP)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from conftest import Stack
from lambda_support import scheduled_event, slack_for_health_check
from slack_sdk.errors import SlackApiError
from support import settle_indexes, wait_for

from agentq.envelope import TaskEnvelope
from agentq.events import now_ms
from agentq.local.lambda_host import local_context
from agentq.local.slack_standin import SlackStandIn
from agentq.store import TaskStore
from lambdas import health_check

pytestmark = pytest.mark.timeout(120)
CTX = local_context("health-check")


@pytest.fixture
def slack(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackStandIn]:
    with slack_for_health_check(monkeypatch) as standin:
        yield standin


def _envelope(request_id: str) -> TaskEnvelope:
    return TaskEnvelope(request_id=request_id, tenant="acme", definition="echo")


def _stuck(stack: Stack, request_id: str) -> None:
    """A worker took the task and stopped heartbeating: its lease runs out."""
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    tasks.create(_envelope(request_id))
    lease = tasks.acquire(_envelope(request_id), worker_id="w-gone", lease_seconds=0.05,
                          max_attempts=5)  # fmt: skip
    wait_for(lambda: now_ms() > lease.effective_until_ms, timeout=5, message="lease expiry")
    settle_indexes(stack)  # the health check finds it through the status index


def test_a_stuck_task_alerts_exactly_once_across_two_runs(
    stack: Stack, slack: SlackStandIn
) -> None:
    _stuck(stack, "r-stuck")

    first = health_check.handler(scheduled_event(), CTX)
    second = health_check.handler(scheduled_event(), CTX)

    assert first["alerted"] == ["stuck:r-stuck"]
    assert second["alerted"] == []
    assert second["findings"] == {"stuck": 1}  # still found, just not re-alerted
    (message,) = slack.messages()
    assert message["channel"] == "#agentq-alerts"
    assert "1 stuck" in message["text"]
    blocks = message["blocks"]
    assert blocks[0]["type"] == "header"
    (section,) = [b for b in blocks if b["type"] == "section"]
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in section["fields"]}
    assert fields["*Task*"] == "`r-stuck`"
    assert fields["*State*"] == "PROCESSING"
    assert fields["*Last event*"] == "—"  # nothing persisted for it yet
    assert fields["*Age*"].endswith(("s", "m"))
    assert "Stuck" in section["text"]["text"]
    commands = [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]
    assert "Inspect: `agentq status r-stuck --tenant acme`" in commands
    (post,) = [r for r in slack.requests if r.method == "chat.postMessage"]
    assert post.headers["authorization"] == "Bearer xoxb-local-test"


def test_a_changed_situation_alerts_again(stack: Stack, slack: SlackStandIn) -> None:
    _stuck(stack, "r-again")
    health_check.handler(scheduled_event(), CTX)
    # A new worker takes the expired task over and dies too: a new occurrence.
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    lease = tasks.acquire(_envelope("r-again"), worker_id="w-2", lease_seconds=0.05,
                          max_attempts=5)  # fmt: skip
    wait_for(lambda: now_ms() > lease.effective_until_ms, timeout=5, message="lease expiry")

    assert health_check.handler(scheduled_event(), CTX)["alerted"] == ["stuck:r-again"]
    assert len(slack.messages()) == 2


def test_slack_rate_limit_is_retried(stack: Stack, slack: SlackStandIn) -> None:
    _stuck(stack, "r-429")
    slack.rate_limit(1, retry_after_s=1)

    result = health_check.handler(scheduled_event(), CTX)

    assert result["alerted"] == ["stuck:r-429"]
    statuses = [r.status for r in slack.requests if r.method == "chat.postMessage"]
    assert statuses == [429, 200]
    assert len(slack.messages()) == 1


def test_a_dropped_connection_is_retried_as_well(stack: Stack, slack: SlackStandIn) -> None:
    # The rate-limit handler is added to slack-sdk's default connection-error handler.
    _stuck(stack, "r-drop")
    slack.drop_connections(1)

    assert health_check.handler(scheduled_event(), CTX)["alerted"] == ["stuck:r-drop"]
    statuses = [r.status for r in slack.requests if r.method == "chat.postMessage"]
    assert statuses == [0, 200]
    assert len(slack.messages()) == 1


def test_undelivered_alert_is_retried_next_run(
    stack: Stack, slack: SlackStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stuck(stack, "r-retry")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "not-a-bot-token")  # Slack answers invalid_auth

    with pytest.raises(SlackApiError):
        health_check.handler(scheduled_event(), CTX)

    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-fixed")
    assert health_check.handler(scheduled_event(), CTX)["alerted"] == ["stuck:r-retry"]
    assert len(slack.messages()) == 1


def test_no_token_logs_the_alert_and_says_so(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    _stuck(stack, "r-notoken")

    with caplog.at_level(logging.WARNING, logger="agentq.alerts.slack"):
        result = health_check.handler(scheduled_event(), CTX)

    assert result["destination"] == "log"
    assert result["alerted"] == ["stuck:r-notoken"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "no Slack token configured" in logged
    assert "r-notoken" in logged


def test_token_and_channel_from_secrets_manager(
    stack: Stack, slack: SlackStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    secrets = boto3.client("secretsmanager", endpoint_url=stack.resources.endpoint_url)
    arn = secrets.create_secret(
        Name=f"{stack.resources.names.prefix}-slack",
        SecretString=json.dumps({"SLACK_BOT_TOKEN": "xoxb-from-secret", "ALERT_CHANNEL": "#ops"}),
    )["ARN"]
    monkeypatch.delenv("SLACK_BOT_TOKEN")
    monkeypatch.delenv("ALERT_CHANNEL")
    monkeypatch.setenv("SLACK_TOKEN_SECRET_ARN", arn)
    _stuck(stack, "r-secret")

    assert health_check.handler(scheduled_event(), CTX)["destination"] == "slack"

    (post,) = [r for r in slack.requests if r.method == "chat.postMessage"]
    assert post.headers["authorization"] == "Bearer xoxb-from-secret"
    assert post.payload["channel"] == "#ops"


def test_overtime_starving_and_dlq_in_one_message(
    stack: Stack, slack: SlackStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OVERTIME_GRACE", "0")
    monkeypatch.setenv("PENDING_ALERT_AFTER", "0")
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    # Overtime: heartbeating (live lease) but past the definition's timeout.
    tasks.create(_envelope("r-long"))
    lease = tasks.acquire(_envelope("r-long"), worker_id="w-1", lease_seconds=60,
                          max_attempts=3, timeout_ms=1)  # fmt: skip
    # Starving: PENDING and nobody took it.
    tasks.create(_envelope("r-waiting"))
    stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody="{}")
    wait_for(lambda: now_ms() > lease.effective_until_ms - 59_000, timeout=5,
             message="past the 1 ms deadline")  # fmt: skip
    settle_indexes(stack)  # the check finds them through the status index

    result = health_check.handler(scheduled_event(), CTX)

    assert result["findings"] == {"overtime": 1, "starving": 1, "dlq": 1}
    assert result["dlqDepth"] == 1
    (message,) = slack.messages()
    texts = json.dumps(message["blocks"])
    assert "r-long" in texts
    assert "r-waiting" in texts
    assert "1 message(s) waiting in the DLQ" in texts
    assert "agentq dlq list --peek" in texts
