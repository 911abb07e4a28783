"""The health alert's Block Kit message against Slack's limits and any finding text.

Slack refuses a whole message (`invalid_blocks`) over 50 blocks or with a text over its
limit, and reads `<...>` in mrkdwn as a mention or a link; finding text comes from
stored task records and events, which a principal with events:PutEvents can forge.
The limits here are Slack's documented numbers, not the module's constants.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from agentq.alerts.slack import build_message
from agentq.health import Condition, Finding, HealthReport
from agentq.local.slack_standin import SlackStandIn

MAX_BLOCKS = 50
HEADER_MAX, SECTION_MAX, FIELD_MAX, TEXT_MAX = 150, 3000, 2000, 3000
# An `&` that starts none of the three entities Slack's escaping produces.
BARE_AMPERSAND = re.compile(r"&(?!amp;|lt;|gt;)")
INJECTIONS = ["<!channel>", "<!here>", "<@U123>", "<#C1>", "<http://evil.example|click>",
              "&", "&lt;", "&amp;gt;", "<", ">", "`", "*", "\n"]  # fmt: skip
PIECE = st.one_of(st.text(max_size=20), st.sampled_from(INJECTIONS))
# Short mixes of anything and the markup that matters, or one piece repeated past every limit.
DATA = st.one_of(
    st.lists(PIECE, max_size=6).map("".join),
    st.tuples(PIECE.filter(bool), st.integers(150, 1000)).map(lambda t: t[0] * t[1]),
)
CONDITION = st.sampled_from(["stuck", "overtime", "starving", "dlq", "repaired"])
FINDING = st.builds(
    Finding,
    condition=CONDITION,
    subject=DATA,
    tenant=st.none() | DATA,
    state=st.none() | DATA,
    age_s=st.floats(0, 1e7),
    version=st.just("1"),
    summary=DATA,
    last_event=st.none() | DATA,
    inspect=st.none() | DATA,
)


def _finding(n: int, condition: Condition = "stuck") -> Finding:
    return Finding(condition=condition, subject=f"r-{n}", tenant="acme", state="PROCESSING",
                   age_s=60, version="1", summary="no heartbeat", inspect=f"agentq status r-{n}")  # fmt: skip


def _message(findings: list[Finding], stage: str = "dev") -> list[dict[str, Any]]:
    report = HealthReport(checked_at_ms=0, findings=findings, dlq=None)
    return build_message(report, findings, stage=stage).blocks


def _texts(blocks: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int]]:
    """Every text object in the blocks with Slack's limit for it."""
    for block in blocks:
        if block["type"] == "header":
            yield block["text"], HEADER_MAX
        elif block["type"] == "section":
            yield block["text"], SECTION_MAX
            yield from ((field, FIELD_MAX) for field in block["fields"])
        elif block["type"] == "context":
            yield from ((element, TEXT_MAX) for element in block["elements"])


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


# One bug shrunk, not each assertion's: shrinking several at once can take minutes.
@settings(max_examples=300, deadline=None, database=None, report_multiple_bugs=False)
@given(findings=st.lists(FINDING, min_size=1, max_size=6), stage=DATA.filter(bool))
def test_any_finding_text_stays_within_limits_and_cannot_mention_or_link(
    findings: list[Finding], stage: str
) -> None:
    blocks = _message(findings, stage)

    assert len(blocks) <= MAX_BLOCKS
    for obj, limit in _texts(blocks):
        text = obj["text"]
        # UTF-8 bytes: within the limit whether Slack counts bytes, UTF-16 units or characters.
        assert 0 < len(text.encode()) <= limit, (obj["type"], len(text))
        if obj["type"] == "mrkdwn":  # agentq's own markup has no `<`, `>` or `&`
            assert "<" not in text and ">" not in text, text
            assert not BARE_AMPERSAND.search(text), text


@settings(max_examples=100, deadline=None, database=None, report_multiple_bugs=False)
@given(summary=DATA)
def test_data_is_shown_escaped_and_a_cut_is_marked(summary: str) -> None:
    finding = Finding(condition="repaired", subject="r-1", tenant="acme", state=None,
                      age_s=1, version="1", summary=summary)  # fmt: skip
    (section,) = [b for b in _message([finding]) if b["type"] == "section"]
    text = section["text"]["text"]
    shown = _unescape(text.split("\n", 1)[1])

    if shown != summary:
        assert shown.endswith("… [truncated]"), shown
        assert summary.startswith(shown.removesuffix("… [truncated]"))
        assert len(summary) > 100  # only long data is cut


def test_a_channel_mention_in_a_finding_reaches_slack_as_text() -> None:
    finding = Finding(condition="repaired", subject="r-1", tenant="<!channel>", state="<!here>",
                      age_s=1, version="1", summary="lease_lapsed: <!channel> <http://x|link> & co",
                      last_event="<@U123>", inspect="agentq status <!channel>")  # fmt: skip
    blocks = _message([finding])

    texts = "\n".join(obj["text"] for obj, _ in _texts(blocks))
    assert "<" not in texts and ">" not in texts
    assert "lease_lapsed: &lt;!channel&gt; &lt;http://x|link&gt; &amp; co" in texts
    assert "*Tenant*\n&lt;!channel&gt;" in texts
    assert "*Last event*\n&lt;@U123&gt;" in texts
    assert "Inspect: `agentq status &lt;!channel&gt;`" in texts


@pytest.mark.parametrize("count", range(1, 61))
def test_any_number_of_findings_fits_in_50_blocks_and_the_rest_are_counted(count: int) -> None:
    blocks = _message([_finding(n) for n in range(count)])

    assert len(blocks) <= MAX_BLOCKS
    shown = sum(1 for b in blocks if b["type"] == "section")
    note = blocks[-1]["elements"][0]["text"] if blocks[-1]["type"] == "context" else ""
    if shown < count:
        assert note.startswith(f"…and {count - shown} more not shown ({count - shown} stuck)")
    else:
        assert "more not shown" not in note
    assert shown >= min(count, 15)  # as many as fit, with room for the note


def test_every_condition_is_shown_when_findings_overflow() -> None:
    findings = [_finding(n) for n in range(40)] + [_finding(40, "repaired"), _finding(41, "dlq")]

    blocks = _message(findings)

    titles = [b["text"]["text"].split("\n")[0] for b in blocks if b["type"] == "section"]
    assert any("Repaired" in title for title in titles)
    assert any("Dead-letter" in title for title in titles)


# -- the stand-in refuses what Slack refuses ---------------------------------------
@pytest.fixture(scope="module")
def standin() -> Iterator[SlackStandIn]:
    with SlackStandIn() as server:
        yield server


def _post(standin: SlackStandIn, blocks: list[dict[str, Any]]) -> str:
    client = WebClient(token="xoxb-local", base_url=standin.base_url)
    try:
        client.chat_postMessage(channel="#a", text="t", blocks=blocks)
    except SlackApiError as error:
        return str(error.response["error"])
    return "ok"


def _mrkdwn(length: int) -> dict[str, str]:
    return {"type": "mrkdwn", "text": "x" * length}


@pytest.mark.parametrize(
    ("blocks", "answer"),
    [
        ([{"type": "divider"}] * 50, "ok"),
        ([{"type": "divider"}] * 51, "invalid_blocks"),
        ([{"type": "section", "text": _mrkdwn(3000)}], "ok"),
        ([{"type": "section", "text": _mrkdwn(3001)}], "invalid_blocks"),
        ([{"type": "section", "fields": [_mrkdwn(2000)]}], "ok"),
        ([{"type": "section", "fields": [_mrkdwn(2001)]}], "invalid_blocks"),
        ([{"type": "header", "text": {"type": "plain_text", "text": "x" * 150}}], "ok"),
        ([{"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}], "invalid_blocks"),
        ([{"type": "context", "elements": [_mrkdwn(3001)]}], "invalid_blocks"),
    ],
)
def test_the_standin_refuses_blocks_slack_refuses(
    standin: SlackStandIn, blocks: list[dict[str, Any]], answer: str
) -> None:
    assert _post(standin, blocks) == answer
