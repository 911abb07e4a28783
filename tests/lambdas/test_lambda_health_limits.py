"""health-check in a big incident and with forged event text, through real slack-sdk
against the local Slack stand-in, which refuses what Slack refuses (`invalid_blocks`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Stack
from lambda_support import scheduled_event, slack_for_health_check
from support import settle_indexes, wait_for

from agentq.envelope import TaskEnvelope
from agentq.events import Event, now_ms
from agentq.local.lambda_host import local_context
from agentq.local.slack_standin import SlackStandIn
from agentq.store import EventStore, TaskStore
from lambdas import health_check

pytestmark = pytest.mark.timeout(120)
CTX = local_context("health-check")


@pytest.fixture
def slack(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackStandIn]:
    with slack_for_health_check(monkeypatch) as standin:
        yield standin


def _texts(blocks: list[dict[str, Any]]) -> list[str]:
    texts = []
    for block in blocks:
        texts += [block["text"]["text"]] if "text" in block else []
        texts += [item["text"] for item in block.get("fields", []) + block.get("elements", [])]
    return texts


def test_forty_stuck_tasks_and_the_dlq_post_one_message_slack_accepts(
    stack: Stack, slack: SlackStandIn
) -> None:
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    leases = []
    for n in range(40):
        envelope = TaskEnvelope(request_id=f"r-big-{n:02d}", tenant="acme", definition="echo")
        tasks.create(envelope)
        leases.append(tasks.acquire(envelope, worker_id="w-gone", lease_seconds=0.05,
                                    max_attempts=5))  # fmt: skip
    stack.sqs.send_message(QueueUrl=stack.resources.dlq_url, MessageBody="{}")
    last = max(lease.effective_until_ms for lease in leases)
    wait_for(lambda: now_ms() > last, timeout=10, message="every lease expired")
    settle_indexes(stack)  # the check finds stuck tasks through the status index

    first = health_check.handler(scheduled_event(), CTX)
    second = health_check.handler(scheduled_event(), CTX)

    assert [r.ok for r in slack.requests if r.method == "chat.postMessage"] == [True]
    (message,) = slack.messages()
    blocks = message["blocks"]
    assert len(blocks) <= 50
    assert sum(1 for b in blocks if b["type"] == "section") == 15
    assert blocks[-1]["elements"][0]["text"].startswith("…and 26 more not shown (26 stuck)")
    assert any("1 message(s) waiting in the DLQ" in text for text in _texts(blocks))
    # All 41 were alerted: shown or counted. The next run finds them and stays quiet.
    assert len(first["alerted"]) == 41
    assert second["findings"] == {"stuck": 40, "dlq": 1}
    assert second["alerted"] == []


def test_a_forged_repair_event_cannot_mention_the_channel_or_break_the_post(
    stack: Stack, slack: SlackStandIn
) -> None:
    # What a principal allowed events:PutEvents could store: the health check shows
    # a Task Repaired event's payload.detail (and repair, observedState) in the alert.
    events = EventStore(stack.dynamodb, stack.resources.table_name, app_name="agentq")
    detail = "<!channel> <@U123> <http://evil.example|click here> & " + "x" * 10_000
    events.append(Event(detail_type="Task Repaired", request_id="r-forged", tenant="acme",
                        payload={"repair": "<!here>", "detail": detail,
                                 "observedState": "<!channel>"}))  # fmt: skip
    settle_indexes(stack)  # the check reads repairs through the event-type index

    result = health_check.handler(scheduled_event(), CTX)

    assert result["alerted"] == ["repaired:r-forged"]
    (message,) = slack.messages()
    texts = _texts(message["blocks"])
    assert not [text for text in texts if "<" in text or ">" in text]
    (section,) = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]
    assert "&lt;!here&gt;: &lt;!channel&gt; &lt;@U123&gt; &lt;http://evil.example|click here&gt;" \
        " &amp; xxx" in section  # fmt: skip
    assert section.endswith("xxx… [truncated]")
    assert "*State*\n&lt;!channel&gt;" in texts
