"""ECS task scale-in protection while any slot is busy, bounded so deploys can drain.

ECS may stop a task of a scaling-in service at any moment; with protection on, it
picks an idle one, and a rolling deploy waits for a protected task. A worker under
steady load is never idle, so unbounded renewal would hold a deploy until
CloudFormation gives up. The bound: once protection has been on for
`PROTECTION_MAX_AGE` without a break, the worker retires (`on_retire`): it starts
nothing new, keeps protection while its running tasks finish (each bounded by its own
timeout), drops it and exits, and ECS starts a fresh task, from the new task definition
when a deploy waits.

The agent endpoint comes from `ECS_AGENT_URI`; without it (local runs, EC2) protection
is skipped. The agent answers `{"protection": {...}}` when the change took, `{"failure":
{"Reason": ...}}` or `{"error": {"Code": ..., "Message": ...}}` (with an HTTP error
status) when it did not. A refused or unreachable change is logged once, then tried
again from the worker's tick with the shared jittered backoff until it takes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from worker.settle.outcome import backoff_s
from worker.telemetry import Middleware, TaskEnd, TaskStart

PATH: Final = "/task-protection/v1/state"
RETRY_BASE_S: Final = 1.0
RETRY_MAX_S: Final = 60.0
_MAX_DETAIL: Final = 300
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentAnswer:
    """Whether the agent applied the change, and why not when it did not."""

    applied: bool
    detail: str = ""


def read_answer(status: int, body: bytes, *, enabled: bool) -> AgentAnswer:
    """The agent's reply to a PUT of `ProtectionEnabled = enabled`."""
    try:
        parsed: Any = json.loads(body or b"{}")
    except ValueError:
        parsed = None
    if not isinstance(parsed, Mapping):
        return AgentAnswer(False, f"HTTP {status}, not a JSON object")
    for key, fields in (("failure", ("Reason", "Detail")), ("error", ("Code", "Message"))):
        found = parsed.get(key)
        if isinstance(found, Mapping):
            said = ": ".join(str(found.get(f)) for f in fields if found.get(f))
            return AgentAnswer(False, f"HTTP {status}, {key} {said}"[:_MAX_DETAIL])
    state = parsed.get("protection")
    if not 200 <= status < 300 or not isinstance(state, Mapping):
        return AgentAnswer(False, f"HTTP {status}, no protection state")
    if state.get("ProtectionEnabled") is not enabled:
        return AgentAnswer(False, f"protection is {state.get('ProtectionEnabled')!r}")
    return AgentAnswer(True)


class ScaleInProtection(Middleware):
    """Protection on when the first slot gets busy, off when the last one frees; the
    worker retires once it has been protected for `max_protected_s` without a break."""

    def __init__(
        self,
        agent_uri: str,
        *,
        max_protected_s: float,
        on_retire: Callable[[], None],
        expires_minutes: int = 60,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 5.0,
    ) -> None:
        self._url = agent_uri.rstrip("/") + PATH
        self._expires = expires_minutes
        self._max_protected_s = max_protected_s
        self._on_retire = on_retire
        self._clock = clock
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._busy = 0
        self._held = False  # what the agent last confirmed
        self._renewed_at: float | None = None
        self._protected_since: float | None = None
        self._failures = 0
        self._retry_at: float | None = None
        self.retired = False
        self.calls = 0

    def before_process(self, start: TaskStart) -> None:
        with self._lock:
            self._busy += 1
            if self._busy == 1:
                self._apply()

    def after_process(self, end: TaskEnd) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)
            if self._busy == 0:
                self._apply()

    def refresh(self) -> None:
        """From the worker's tick: retry a failed change, renew before expiry (at half
        of it) while work runs, retire past the bound."""
        retire = False
        with self._lock:
            now = self._clock()
            renew_due = (
                self._busy > 0
                and self._renewed_at is not None
                and now - self._renewed_at > self._expires * 30
            )
            if (self._retry_at is not None and now >= self._retry_at) or (
                self._retry_at is None and renew_due
            ):
                self._apply()
            since = self._protected_since
            if not self.retired and since is not None and now - since >= self._max_protected_s:
                self.retired = retire = True
        if retire:
            logger.warning(
                "scale-in protection held for its maximum; retiring: no new tasks, running "
                "ones finish, then the worker exits for a fresh one",
                extra={"protectedSeconds": round(self._clock() - (since or 0.0))},
            )
            self._on_retire()

    def _apply(self) -> None:
        """Send the wanted state (busy or not); on failure schedule a retry (lock held)."""
        enabled = self._busy > 0
        answer = self._put(enabled)
        now = self._clock()
        if not answer.applied:
            self._failures += 1
            self._retry_at = now + backoff_s(self._failures, base_s=RETRY_BASE_S,
                                             max_s=RETRY_MAX_S)  # fmt: skip
            if self._failures == 1:
                # Once per outage: the retries go on quietly until one takes.
                logger.warning(
                    "scale-in protection update refused; retrying with backoff",
                    extra={"protectionEnabled": enabled, "detail": answer.detail},
                )
            return
        if self._failures:
            logger.info("scale-in protection update took after %d failures", self._failures)
        self._failures = 0
        self._retry_at = None
        if enabled and not self._held:
            self._protected_since = now
        self._held = enabled
        self._renewed_at = now if enabled else None
        if not enabled:
            self._protected_since = None

    def _put(self, enabled: bool) -> AgentAnswer:
        body: dict[str, object] = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = self._expires
        request = urllib.request.Request(
            self._url,
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        self.calls += 1
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                return read_answer(response.status, response.read(), enabled=enabled)
        except urllib.error.HTTPError as exc:
            # The agent's error replies carry a JSON body that says why.
            return read_answer(exc.code, exc.read(), enabled=enabled)
        except OSError as exc:
            # Best effort for the task: a task never fails because the agent blinked.
            return AgentAnswer(False, f"unreachable: {exc}"[:_MAX_DETAIL])
