"""ECS task scale-in protection while any slot is busy.

ECS may stop a task of a scaling-in service at any moment; with protection on, it
picks an idle one. The agent endpoint comes from `ECS_AGENT_URI`; without it (local
runs, EC2) protection is skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from typing import Final

from worker.telemetry import Middleware, TaskEnd, TaskStart

PATH: Final = "/task-protection/v1/state"
logger = logging.getLogger(__name__)


class ScaleInProtection(Middleware):
    """Protection on when the first slot gets busy, off when the last one frees."""

    def __init__(self, agent_uri: str, *, expires_minutes: int = 60) -> None:
        self._url = agent_uri.rstrip("/") + PATH
        self._expires = expires_minutes
        self._lock = threading.Lock()
        self._busy = 0
        self._enabled_at: float | None = None
        self.calls = 0

    def before_process(self, start: TaskStart) -> None:
        with self._lock:
            self._busy += 1
            if self._busy == 1:
                self._set(True)

    def after_process(self, end: TaskEnd) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)
            if self._busy == 0:
                self._set(False)

    def refresh(self) -> None:
        """Renew before expiry while work runs (called from the worker's tick)."""
        with self._lock:
            # Renew at half the expiry.
            stale = self._enabled_at is not None and (
                time.monotonic() - self._enabled_at > self._expires * 30
            )
            if self._busy and stale:
                self._set(True)

    def _set(self, enabled: bool) -> None:
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
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
            self._enabled_at = time.monotonic() if enabled else None
        except OSError as exc:
            # Protection is best effort: a task must not fail because the agent blinked.
            logger.warning("scale-in protection update failed", extra={"error": str(exc)})
