"""Health-check alerts as one Slack message per run (Block Kit), or a log line.

`notifier(settings, secrets)` picks the destination: with a bot token (SLACK_BOT_TOKEN,
or a Secrets Manager secret named by SLACK_TOKEN_SECRET_ARN) and ALERT_CHANNEL, a
`SlackNotifier` posting through slack-sdk's `WebClient` with its rate-limit retry
handler (a 429 is retried after Retry-After); without them, a `LogNotifier` that logs
the alert and says why. The secret may be the bare token or a JSON object with
`SLACK_BOT_TOKEN` and optionally `ALERT_CHANNEL`.

slack-sdk is imported when a message is first sent, not with this module: most
health-check runs find nothing to alert, and its import would be part of every cold
start of the Lambda.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from agentq.errors import ConfigError
from agentq.health import AlertLedger, Finding, HealthReport, dedupe
from agentq.resources import SECRET_PLACEHOLDER

if TYPE_CHECKING:
    from slack_sdk import WebClient

    from agentq.config import Settings

logger = logging.getLogger(__name__)

# Slack's documented limits: blocks per message, characters of a section's text, of one
# of its fields, of a header's plain_text, and of any other text object (the contexts).
# Slack rejects the whole post (`invalid_blocks`) when one is exceeded.
SLACK_MAX_BLOCKS: Final = 50
SECTION_TEXT_MAX: Final = 3000
FIELD_TEXT_MAX: Final = 2000
HEADER_TEXT_MAX: Final = 150
TEXT_MAX: Final = 3000

# Every message has a header and the tally; a finding adds at most three blocks
# (divider, section, Inspect context); one more is kept for the "…and N more" note.
_FIXED_BLOCKS: Final = 2
_BLOCKS_PER_FINDING: Final = 3
_NOTE_BLOCKS: Final = 1
MAX_FINDINGS_SHOWN: Final = (SLACK_MAX_BLOCKS - _FIXED_BLOCKS - _NOTE_BLOCKS) // _BLOCKS_PER_FINDING

# Caps on each piece of a finding's data, far below the limits above: an escaped piece
# (up to 5 characters per character of data) cannot crowd out the rest, the assembled
# texts stay within Slack's limits even counted in UTF-8 bytes (whatever Slack counts),
# and 15 findings stay a readable message. Data is stored events and task records, so
# a principal allowed events:PutEvents decides how long it is.
_SUMMARY_MAX: Final = 500
_VALUE_MAX: Final = 150
_INSPECT_MAX: Final = 300
_STAGE_MAX: Final = 30
_CUT: Final = "… [truncated]"

_TITLES: Final = {
    "stuck": ":rotating_light: Stuck (lease expired, no heartbeat)",
    "overtime": ":hourglass: Overtime (past its deadline)",
    "starving": ":zzz: Starving (waiting for a worker)",
    "dlq": ":inbox_tray: Dead-letter queue",
    "repaired": ":wrench: Repaired by the reconciler (something was lost)",
}


@dataclass(frozen=True, kw_only=True)
class AlertMessage:
    text: str  # the notification fallback
    blocks: list[dict[str, Any]]
    not_shown: tuple[Finding, ...] = ()  # counted in the note, listed in the log


def build_message(report: HealthReport, findings: Sequence[Finding], *, stage: str) -> AlertMessage:
    """One message for a run: a header, then one section per finding shown."""
    tally = _tally(findings)
    text = f"agentq {_data(stage, _STAGE_MAX)}: {tally}"
    # plain_text: Slack shows it as it is, so it is capped but not escaped.
    header = _cap(f"agentq {_cap(stage, _STAGE_MAX)}: health alert", HEADER_TEXT_MAX)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header}},
        _context(tally),
    ]
    chosen = _pick(findings, MAX_FINDINGS_SHOWN)
    for finding in (findings[index] for index in chosen):
        blocks.append({"type": "divider"})
        blocks.append(_section(finding))
        if finding.inspect:
            blocks.append(_context(f"Inspect: `{_data(finding.inspect, _INSPECT_MAX)}`"))
    not_shown = tuple(f for index, f in enumerate(findings) if index not in chosen)
    if not_shown:
        blocks.append(
            _context(f"…and {len(not_shown)} more not shown ({_tally(not_shown)}): "
                     "the health check's log lists them all")
        )  # fmt: skip
    return AlertMessage(text=text, blocks=blocks, not_shown=not_shown)


def _pick(findings: Sequence[Finding], limit: int) -> list[int]:
    """Indexes of at most `limit` findings, in order, taking one of each condition in turn.

    Findings come grouped by condition, the DLQ's last: without taking turns, 40 stuck
    tasks would hide the DLQ (and every other condition) behind the note.
    """
    by_condition: dict[str, list[int]] = {}
    for index, finding in enumerate(findings):
        by_condition.setdefault(finding.condition, []).append(index)
    turns = itertools.zip_longest(*by_condition.values())
    chosen = [index for turn in turns for index in turn if index is not None][:limit]
    return sorted(chosen)


def _tally(findings: Sequence[Finding]) -> str:
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.condition] = counts.get(finding.condition, 0) + 1
    return ", ".join(f"{n} {condition}" for condition, n in sorted(counts.items()))


def _section(finding: Finding) -> dict[str, Any]:
    fields = [
        _field("Task" if finding.tenant else "Queue", f"`{_data(finding.subject, _VALUE_MAX)}`"),
        _field("State", _data(finding.state or "—", _VALUE_MAX)),
        _field("Age", _span(finding.age_s)),
        _field("Last event", _data(finding.last_event or "—", _VALUE_MAX)),
    ]
    if finding.tenant:
        fields.append(_field("Tenant", _data(finding.tenant, _VALUE_MAX)))
    title, summary = _TITLES[finding.condition], _data(finding.summary, _SUMMARY_MAX)
    return {
        "type": "section",
        "text": {"type": "mrkdwn", "text": _cap(f"*{title}*\n{summary}", SECTION_TEXT_MAX)},
        "fields": fields,
    }


def _field(label: str, value: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _cap(f"*{label}*\n{value}", FIELD_TEXT_MAX)}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": _cap(text, TEXT_MAX)}]}


def _data(value: str, limit: int) -> str:
    """A piece of data as mrkdwn: escaped, so it can neither mention nor link, and capped."""
    return _cap(_escape(value), limit)


def _escape(text: str) -> str:
    # Slack's documented escaping, and all of it: `<` opens mentions (<!channel>, <@U1>)
    # and links (<http://x|label>). `&` first, or the other two's `&` would be doubled.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cap(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with a visible mark, never through an entity."""
    if len(text) <= limit:
        return text
    cut = text[: limit - len(_CUT)]
    # Every `&` in escaped text starts an entity of at most 5 characters (&amp;); one
    # cut short would show its remains ("&am"), so it goes whole.
    amp = cut.rfind("&", max(len(cut) - 4, 0))
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + _CUT


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


class Notifier(Protocol):
    destination: str

    def send(self, message: AlertMessage) -> None: ...


class SlackNotifier:
    destination = "slack"

    def __init__(
        self,
        token: str,
        channel: str,
        *,
        base_url: str | None = None,
        max_rate_limit_retries: int = 3,
    ) -> None:
        self.channel = channel
        self._token = token
        self._base_url = base_url or "https://slack.com/api/"
        self._max_rate_limit_retries = max_rate_limit_retries

    @functools.cached_property
    def client(self) -> WebClient:
        from slack_sdk import WebClient
        from slack_sdk.http_retry import default_retry_handlers
        from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

        return WebClient(
            token=self._token,
            base_url=self._base_url,
            timeout=10,
            # Added to slack-sdk's defaults (a retry on connection errors), not instead.
            retry_handlers=[
                *default_retry_handlers(),
                RateLimitErrorRetryHandler(max_retry_count=self._max_rate_limit_retries),
            ],
        )

    def send(self, message: AlertMessage) -> None:
        # SlackApiError (bad token, channel not found, still rate-limited) propagates:
        # the caller releases its dedupe claims so the next run alerts again.
        self.client.chat_postMessage(
            channel=self.channel, text=message.text, blocks=message.blocks, unfurl_links=False
        )


class LogNotifier:
    destination = "log"

    def __init__(self, why: str) -> None:
        self.why = why

    def send(self, message: AlertMessage) -> None:
        logger.warning(
            "health alert logged instead of posted to Slack (%s): %s\n%s",
            self.why,
            message.text,
            json.dumps(message.blocks, indent=1),
        )


def notifier(settings: Settings, secrets: Any = None) -> Notifier:
    token, channel = settings.slack_token, settings.alert_channel
    if not token and settings.slack_token_secret_arn:
        if secrets is None:
            raise ConfigError("SLACK_TOKEN_SECRET_ARN", "is set but no Secrets Manager client")
        token, from_secret = _read_secret(secrets, settings.slack_token_secret_arn)
        channel = channel or from_secret
    if not token:
        return LogNotifier(
            "no Slack token configured: set SLACK_BOT_TOKEN or SLACK_TOKEN_SECRET_ARN"
        )
    if token.strip() == SECRET_PLACEHOLDER:
        # The stack deploys the secret with this value; posting with it only fails.
        return LogNotifier(
            "the Slack token secret still holds the placeholder the stack deployed: "
            "put the bot token in (docs/operations.md, 'Secrets')"
        )
    if not channel:
        return LogNotifier("no Slack channel configured: set ALERT_CHANNEL")
    return SlackNotifier(token, channel, base_url=settings.slack_api_url)


def _read_secret(secrets: Any, arn: str) -> tuple[str | None, str | None]:
    raw = str(secrets.get_secret_value(SecretId=arn).get("SecretString") or "").strip()
    if raw.startswith("{"):
        data = json.loads(raw)
        return data.get("SLACK_BOT_TOKEN") or data.get("token"), data.get("ALERT_CHANNEL")
    return raw or None, None


def alert(
    report: HealthReport, ledger: AlertLedger, sink: Notifier, *, stage: str
) -> list[Finding]:
    """Send one message with the findings not alerted before; returns what was sent.

    Claims come first so that overlapping runs alert once; if sending fails, the
    claims are released and the error propagates, so the next run tries again.
    """
    fresh = dedupe(report.findings, ledger, at_ms=report.checked_at_ms)
    if not fresh:
        return []
    try:
        message = build_message(report, fresh, stage=stage)
        sink.send(message)
    except Exception:
        for finding in fresh:
            ledger.release(finding)
        raise
    # The findings beyond what one message can show keep their claims and count as
    # alerted: the message counts them (tally and note) and this log names them. Left
    # unclaimed, a long incident would post 15 more every run until it ended, each post
    # repeating the news of the first; released with the rest if the post failed.
    if message.not_shown:
        logger.warning(
            "health alert showed %d of %d findings; not shown: %s",
            len(fresh) - len(message.not_shown),
            len(fresh),
            ", ".join(f"{f.condition}:{f.subject}" for f in message.not_shown),
        )
    return fresh
