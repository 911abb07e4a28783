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

# Block Kit allows 50 blocks per message; keep room for the header and the overflow note.
MAX_FINDINGS_SHOWN: Final = 20
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


def build_message(report: HealthReport, findings: Sequence[Finding], *, stage: str) -> AlertMessage:
    """One message for a run: a header, then one section per finding."""
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.condition] = counts.get(finding.condition, 0) + 1
    tally = ", ".join(f"{n} {condition}" for condition, n in sorted(counts.items()))
    text = f"agentq {stage}: {tally}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"agentq {stage}: health alert"}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": tally}]},
    ]
    for finding in findings[:MAX_FINDINGS_SHOWN]:
        blocks.append({"type": "divider"})
        blocks.append(_section(finding))
        if finding.inspect:
            blocks.append(
                {"type": "context",
                 "elements": [{"type": "mrkdwn", "text": f"Inspect: `{finding.inspect}`"}]}
            )  # fmt: skip
    hidden = len(findings) - MAX_FINDINGS_SHOWN
    if hidden > 0:
        blocks.append(
            {"type": "context",
             "elements": [{"type": "mrkdwn", "text": f"…and {hidden} more not shown"}]}
        )  # fmt: skip
    return AlertMessage(text=text, blocks=blocks)


def _section(finding: Finding) -> dict[str, Any]:
    fields = [
        _field("Task" if finding.tenant else "Queue", f"`{finding.subject}`"),
        _field("State", finding.state or "—"),
        _field("Age", _span(finding.age_s)),
        _field("Last event", finding.last_event or "—"),
    ]
    if finding.tenant:
        fields.append(_field("Tenant", finding.tenant))
    return {
        "type": "section",
        "text": {"type": "mrkdwn", "text": f"*{_TITLES[finding.condition]}*\n{finding.summary}"},
        "fields": fields,
    }


def _field(label: str, value: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": f"*{label}*\n{value}"}


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
        sink.send(build_message(report, fresh, stage=stage))
    except Exception:
        for finding in fresh:
            ledger.release(finding)
        raise
    return fresh
