"""moto's server, made as atomic as DynamoDB where agentq depends on it.

moto evaluates a DynamoDB condition expression and applies the write as two steps
without a lock, so two threads of its server can both pass the same condition: the
lock at the heart of agentq would not be exclusive locally, while it is on AWS. This
launcher serializes DynamoDB requests (they are fast) and leaves every other service
(SQS long polls above all) concurrent.

    python -m agentq.local.moto_server --host 127.0.0.1 --port 5000
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class SerializedDynamoDB:
    """WSGI middleware: one DynamoDB request at a time, everything else in parallel."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith("DynamoDB"):
            with self._lock:
                # Drain the body inside the lock: the write happens while it is produced.
                return list(self._app(environ, start_response))
        return self._app(environ, start_response)


def _stop(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    app = SerializedDynamoDB(DomainDispatcherApplication(create_backend_app))
    run_simple(
        args.host,
        args.port,
        app,  # type: ignore[arg-type]
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
