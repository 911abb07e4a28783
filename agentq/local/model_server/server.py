"""The model server: lifecycle, request log and counters, and the command line."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from agentq.local.model_server.grammar import parse_markers
from agentq.local.model_server.http_handler import HTTPServer, Stopped
from agentq.local.model_server.request import Request
from agentq.local.model_server.scenario import (
    DEFAULT_KEY,
    RequestRecord,
    Rule,
    Scenario,
)
from agentq.local.model_server.script import load_script, rule_from_mapping
from agentq.signal_relay import SignalRelay


class ModelServer:
    """Loopback HTTP server answering the Anthropic Messages API deterministically.

    Use as a context manager or call :meth:`start` / :meth:`stop`. ``script`` is a JSON/YAML
    path or already-parsed rules (see the module docstring for the grammar).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        script: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        *,
        verbose: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.verbose = verbose
        self.rules: list[Rule] = load_script(script) if script is not None else []
        self.request_log: list[RequestRecord] = []
        self._counts: dict[str, int] = {}
        self._turn_counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> ModelServer:
        if self._httpd is not None:
            return self
        self._stop.clear()
        self._httpd = HTTPServer((self.host, self.port), self)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"model-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; release stalled requests and close every open connection."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        httpd.shutdown()
        with self._lock:
            conns = list(self._connections)
            self._connections.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("ModelServer is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    # ---- scripting and inspection --------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        """``/v1/messages`` requests received per scenario key (a copy)."""
        with self._lock:
            return dict(self._counts)

    def add_rule(self, rule: Mapping[str, Any]) -> Rule:
        """Append one script rule (same fields as in a script file)."""
        parsed = rule_from_mapping(rule, len(self.rules))
        with self._lock:
            self.rules.append(parsed)
        return parsed

    def reset(self) -> None:
        """Forget the request log and all counters (rules stay)."""
        with self._lock:
            self.request_log.clear()
            self._counts.clear()
            self._turn_counts.clear()

    def requests(self, key: str | None = None) -> list[RequestRecord]:
        """``/v1/messages`` records, optionally only those of one scenario key."""
        with self._lock:
            return [
                r for r in self.request_log if r.key is not None and (key is None or r.key == key)
            ]

    def wait_for(
        self,
        predicate: Callable[[RequestRecord], bool] | None = None,
        *,
        count: int = 1,
        timeout: float = 10.0,
    ) -> bool:
        """Block until ``count`` records satisfy ``predicate`` (default: any /v1/messages
        request). Returns False on timeout."""
        check = predicate or (lambda r: r.key is not None)
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(1 for r in self.request_log if check(r)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return False
                self._changed.wait(remaining)
            return True

    # ---- internals used by the handler ---------------------------------------------------

    def track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def sleep(self, seconds: float | None) -> None:
        """Sleep (None: until stop); raise Stopped if the server stops meanwhile."""
        if self._stop.wait(seconds):
            raise Stopped

    def scenario_for(self, req: Request) -> tuple[Scenario, str, str]:
        marker_scn, _ = parse_markers(req.all_text)
        _, prompt = parse_markers(req.prompt)
        prompt = prompt.strip()
        scn = Scenario()
        key: str | None = None
        for rule in self.rules:
            if rule.matches(req.all_text):
                scn, key = rule.scenario, rule.key
                break
        if marker_scn is not None:
            scn = scn.merge(marker_scn) if key is not None else marker_scn
            key = marker_scn.key or key or marker_scn.source
        return scn, key or DEFAULT_KEY, prompt

    def count_request(self, key: str, turn: int) -> tuple[int, int]:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._turn_counts[(key, turn)] = self._turn_counts.get((key, turn), 0) + 1
            return self._counts[key], self._turn_counts[(key, turn)]

    def new_record(self, **kwargs: Any) -> RequestRecord:
        with self._changed:
            rec = RequestRecord(index=len(self.request_log), received_at=time.time(), **kwargs)
            self.request_log.append(rec)
            self._changed.notify_all()
            return rec

    def finish_record(
        self,
        rec: RequestRecord,
        *,
        status: int,
        outcome: str,
        usage: dict[str, int] | None = None,
        content: list[dict[str, Any]] | None = None,
    ) -> None:
        with self._changed:
            rec.status = status
            rec.outcome = outcome
            rec.usage = usage
            rec.response_content = content or []
            self._changed.notify_all()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentq.local.model_server",
        description="Offline stand-in for the Anthropic Messages API (development only).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="JSON or YAML rules file")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")
    args = parser.parse_args(argv)

    server = ModelServer(args.host, args.port, args.script, verbose=args.verbose)
    done = threading.Event()
    SignalRelay(lambda signum: done.set()).install()
    server.start()
    print(server.url, flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        server.stop()
    print("stopped", file=sys.stderr, flush=True)
    return 0
