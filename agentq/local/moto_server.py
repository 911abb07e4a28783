"""moto's server, made as atomic as DynamoDB where agentq depends on it, and cheaper.

moto evaluates a DynamoDB condition expression and applies the write as two steps
without a lock, so two threads of its server can both pass the same condition: the
lock at the heart of agentq would not be exclusive locally, while it is on AWS. This
launcher serializes DynamoDB requests (they are fast) and leaves every other service
(SQS long polls above all) concurrent.

It takes the cost out of hot spots without changing an answer (profiled under the
saturation benchmark): connections kept open; plain header lines read without the email
parser; per request, moto's backend lookup by host and its listing of the response
class's methods: remembered; EventBridge's JSONPath parser per path of each event:
kept; SQS's clock through datetime arithmetic for every message it looks at:
`time.time()`; SQS's retention check per returned message, which computed every queue
attribute three times (a receive of ten from a 600-message queue: 104 ms): the period
read from the queue; DynamoDB's costs that grow with the table or the expression rather
than the request (agentq.local.moto_dynamodb, agentq.local.moto_expressions).

Each patch's target is checked before anything is patched (agentq/local/moto_guards.py):
a moto that moved one refuses to start, naming its version, rather than run unpatched
or wrongly patched; tests/local/test_moto_guards.py shows each patch answers as moto does.
With `--iam` it enforces IAM the way AWS does for agentq's calls (agentq.local.moto_iam),
and it always keeps the AWS rules of agentq.local.rules.

    python -m agentq.local.moto_server --host 127.0.0.1 --port 5000 [--iam]
"""

from __future__ import annotations

import argparse
import email.parser
import functools
import http.client
import io
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, BinaryIO

from agentq.local import moto_guards
from agentq.local.moto_dynamodb import checked_dynamodb_patches
from agentq.local.rules import _dynamodb as dynamodb_rules
from agentq.local.rules import install_all as install_aws_rules

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
                answer = list(self._app(environ, start_response))
            dynamodb_rules.run_deferred()  # a transaction in flight ends here (agentq.local.rules)
            return answer
        return self._app(environ, start_response)


def _dispatcher(create_app: Callable[[Any], Any]) -> WsgiApp:
    domain_dispatcher: Any = moto_guards.dispatcher()

    class RememberingDispatcher(domain_dispatcher):  # type: ignore[misc]
        """moto's dispatcher with its host -> backend lookup remembered (it is pure)."""

        def __init__(self, create: Callable[[Any], Any]) -> None:
            super().__init__(create)
            self._backend_by_host: dict[str | None, Any] = {}

        def get_backend_for_host(self, host: str | None) -> Any:
            try:
                return self._backend_by_host[host]
            except KeyError:
                backend = super().get_backend_for_host(host)
                self._backend_by_host[host] = backend
                return backend

    return RememberingDispatcher(create_app)  # type: ignore[return-value]


def _unix_time(dt: Any = None, *, original: Callable[[Any], float]) -> float:
    return time.time() if dt is None else original(dt)


def _unix_time_millis(dt: Any = None, *, original: Callable[[Any], float]) -> float:
    return time.time() * 1000.0 if dt is None else original(dt)


def _retained(self: Any, queue_name: str, message: Any) -> bool:
    """moto's retention check (a method of its SQSBackend), reading the one attribute it
    needs (see the module doc)."""
    from moto.sqs.models import unix_time

    period = self.get_queue(queue_name).message_retention_period
    return bool(period + message.sent_timestamp / 1000 > unix_time())


_retained.reads_retention_only = True  # type: ignore[attr-defined]


def speed_up_moto() -> None:
    """Patch moto's pure hot spots (see the module doc). Idempotent.

    Every target is checked first (agentq/local/moto_guards.py): a moto whose internals
    moved is refused with `IncompatibleDependency` before anything is patched.
    """
    jsonpath, parse = moto_guards.jsonpath_parse()
    sqs_models, clocks = moto_guards.sqs_clocks()
    sqs_backend: Any = moto_guards.sqs_retention()
    responses: Any = moto_guards.response_method_names()
    patch_dynamodb = checked_dynamodb_patches()
    if not hasattr(parse, "cache_info"):
        # Parsed paths are only read (`find`), never changed: safe to share.
        setattr(jsonpath, "parse", functools.lru_cache(maxsize=256)(parse))  # noqa: B010
    for name, fast in (("unix_time", _unix_time), ("unix_time_millis", _unix_time_millis)):
        clock = clocks[name]
        if not isinstance(clock, functools.partial):
            setattr(sqs_models, name, functools.partial(fast, original=clock))
    if not hasattr(sqs_backend.is_message_valid_based_on_retention_period, "reads_retention_only"):
        sqs_backend.is_message_valid_based_on_retention_period = _retained
    if not hasattr(responses.method_names_from_class, "cache_info"):
        # A class's methods do not change once the server serves.
        responses.method_names_from_class = functools.cache(responses.method_names_from_class)
    patch_dynamodb()


_HEADER_NAME = re.compile(r"[\041-\071\073-\176]+")  # the email parser's name characters


def _parse_headers(fp: BinaryIO, _class: type[Any] = http.client.HTTPMessage) -> Any:
    """http.client.parse_headers, without the email parser for plain `Name: value`
    lines (a tenth of the server's CPU); anything else (a folded line, a stray CR, a line
    that is no header) goes through the email parser as in http.client."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]
    message = _class()
    for line in lines[:-1]:
        text = line.decode("iso-8859-1")
        body = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else "\r"
        name, colon, value = body.partition(":")
        if not colon or "\r" in body or "\n" in body or not _HEADER_NAME.fullmatch(name):
            return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))
        message[name] = value.lstrip(" \t")
    return message


def _stop(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--iam", action="store_true", help="enforce IAM (agentq.local.moto_iam); default off"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    speed_up_moto()
    install_aws_rules()  # AWS rules moto does not keep (agentq.local.rules)
    if args.iam:
        from agentq.local.aws import LOCAL_CREDENTIALS
        from agentq.local.moto_iam import enforce_iam

        enforce_iam(
            admin_key=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            admin_secret=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    class QuietRequestHandler(MotoRequestHandler):  # type: ignore[misc]
        """moto's handler, keeping connections alive and logging nothing.

        werkzeug closes every connection, since after a response it drains the socket
        and would swallow the next request: botocore then opens a connection (and the
        server a thread) per call. A request whose body has a length is read whole
        first, so the drain finds nothing of it and the connection can stay open.
        """

        keep_alive = False

        def setup(self) -> None:
            super().setup()
            # A response goes out as headers, then body: on a connection kept open,
            # Nagle's algorithm would hold the body for the client's delayed ACK.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def run_wsgi(self) -> None:
            length = self.headers.get("Content-Length", "0")
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked or not length.isdigit():
                self.keep_alive = False
                super().run_wsgi()
                return
            socket_file = self.rfile
            self.rfile = io.BytesIO(socket_file.read(int(length)))
            self.keep_alive = True
            try:
                super().run_wsgi()
            finally:
                self.rfile = socket_file

        def send_header(self, keyword: str, value: str) -> None:
            if keyword == "Connection" and value == "close" and self.keep_alive:
                return
            super().send_header(keyword, value)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            """Not formatted: a line per request (its date and all, ~7 % of the
            server's CPU) that goes nowhere (agentq.local.moto_process discards it)."""

    if hasattr(http.client, "_read_headers"):  # http.server parses each request's with it
        http.client.parse_headers = _parse_headers  # type: ignore[assignment]
    app = SerializedDynamoDB(_dispatcher(create_backend_app))
    run_simple(
        args.host,
        args.port,
        app,  # type: ignore[arg-type]
        threaded=True,
        request_handler=QuietRequestHandler,
    )


if __name__ == "__main__":
    main()
