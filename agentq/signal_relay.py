"""Reactions to SIGTERM and SIGINT that run on a thread of their own, not in the handler.

CPython runs a signal handler in the main thread between two bytecodes, and that can be
while the main thread holds a lock: the condition of the `Event` it waits on, a logging
handler's, a table's. A handler that takes the same lock waits for itself for ever: a
worker told to drain never drains, and `agentq local up` ignored Ctrl-C this way. The
handler installed here only writes the signal's number to a pipe, which takes no lock;
a daemon thread reads it and calls the reaction, which may take any lock, since the main
thread goes on and releases it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final

logger = logging.getLogger(__name__)

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


class SignalRelay:
    """`SignalRelay(react).install()` in the main thread; `react(signum)` then runs on the
    relay thread for each signal, in order. `uninstall()` puts the old handlers back."""

    def __init__(self, react: Callable[[int], None], signals: Iterable[int] = STOP_SIGNALS) -> None:
        self._react = react
        self._signals = tuple(signals)
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()
        self._read_fd = -1
        self._write_fd = -1
        self._thread: threading.Thread | None = None

    def install(self) -> SignalRelay:
        """Install the handlers; only the main thread may (as for `signal.signal`)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._thread = threading.Thread(target=self._relay, name="signal-relay", daemon=True)
        self._thread.start()
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._write_fd >= 0:
            os.close(self._write_fd)  # the relay thread reads the end of the pipe and stops
            self._write_fd = -1
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A fork of this process (none of agentq's children are) must not stop it.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write_fd, bytes((signum,)))

    def _relay(self) -> None:
        try:
            while received := os.read(self._read_fd, 64):
                for signum in received:
                    try:
                        self._react(signum)
                    except Exception:
                        logger.exception("reacting to a signal failed", extra={"signal": signum})
        finally:
            os.close(self._read_fd)
