"""The lease, mirrored into the task dir, so a child outlives no lease.

A worker that freezes (SIGSTOP, CPU starvation, a partition from DynamoDB) stops
renewing its leases, and another worker takes the task over once the lease expires;
without this, the old child would keep running beside the new attempt. The worker
writes each lease's expiry to `TASK_DIR/lease.json` when it locks and at every renewal;
a watchdog thread in the child kills the child's own process group (the Claude CLI
included) once that time has passed. Both sides read one host's clock, so no skew.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Final

LEASE_FILE: Final = "lease.json"
CHECK_INTERVAL_S: Final = 0.25


def write_lease(task_dir: Path, effective_until_ms: int) -> None:
    path = task_dir / LEASE_FILE
    partial = path.with_name(LEASE_FILE + ".partial")
    partial.write_text(json.dumps({"effectiveUntil": effective_until_ms}))
    os.replace(partial, path)


def read_lease(task_dir: Path) -> int | None:
    try:
        value = json.loads((task_dir / LEASE_FILE).read_text())["effectiveUntil"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int | float) else None


def _watch(task_dir: Path) -> None:
    while True:
        until = read_lease(task_dir)
        if until is not None and time.time() * 1000 >= until:
            # Our lease is gone: another attempt may start any moment. End all of us now.
            with contextlib.suppress(OSError):
                os.write(2, b"agentq: lease expired without renewal; stopping this attempt\n")
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(CHECK_INTERVAL_S)


def start_watchdog(task_dir: Path) -> None:
    """In the child: die with the lease. No lease file (run by hand): no watchdog."""
    if read_lease(task_dir) is None:
        return
    threading.Thread(target=_watch, args=(task_dir,), name="lease-watchdog", daemon=True).start()
