"""A counting relay in front of moto's S3: every request the workers make, exactly.

Workers get `AWS_ENDPOINT_URL_S3` pointed here (boto3 prefers a service's own endpoint
variable), so S3 requests pass through and the rest of AWS goes straight to moto. Each
request is relayed byte for byte (headers, signature and all) and recorded: method,
object key, status, the body's size as sent (the decoded length of an aws-chunked body)
and the size of the answer. A botocore retry is a request of its own, as AWS bills it.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Final
from urllib.parse import unquote, urlsplit

# Hop-by-hop headers (RFC 9110 7.6.1) are the relay's own business on each side.
HOP_BY_HOP: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade"})


@dataclass(frozen=True, kw_only=True)
class S3Request:
    method: str
    key: str  # the object key ("" for a bucket-level request)
    status: int
    sent_bytes: int  # the object's bytes a PutObject carried
    received_bytes: int  # the answer's body
    at: float  # when the answer was relayed (time.time())


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RelayServer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the counts are the record."""

    def _relay(self) -> None:
        body = self._read_body()
        target = self.server.target
        upstream = http.client.HTTPConnection(
            target.hostname or "127.0.0.1", target.port, timeout=60
        )
        try:
            upstream.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)  # fmt: skip
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            answer = upstream.getresponse()
            payload = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        # A HEAD answer states the object's length and carries no body.
        length = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        decoded = self.headers.get("x-amz-decoded-content-length")
        self.server.record(S3Request(
            method=self.command,
            key=_object_key(self.path),
            status=answer.status,
            sent_bytes=int(decoded) if decoded is not None else len(body),
            received_bytes=len(payload),
            at=time.time(),
        ))  # fmt: skip

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    # http.server dispatches on these names.
    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay  # noqa: N815


def _object_key(path: str) -> str:
    """Path-style addressing: /BUCKET/KEY?query."""
    parts = unquote(urlsplit(path).path).lstrip("/").split("/", 1)
    return parts[1] if len(parts) == 2 else ""


class _RelayServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str, counter: S3Counter) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.target = urlsplit(target)
        self._counter = counter

    def record(self, request: S3Request) -> None:
        self._counter.add(request)


class S3Counter:
    """The relay and its record. Use as a context manager; `url` is the endpoint to give."""

    def __init__(self, target: str) -> None:
        self._server = _RelayServer(target, self)
        self._lock = threading.Lock()
        self._requests: list[S3Request] = []
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="s3-counter", daemon=True)  # fmt: skip

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, request: S3Request) -> None:
        with self._lock:
            self._requests.append(request)

    def requests(self, *, key_suffix: str = "", method: str = "") -> list[S3Request]:
        with self._lock:
            return [r for r in self._requests
                    if r.key.endswith(key_suffix) and (not method or r.method == method)]  # fmt: skip

    def __enter__(self) -> S3Counter:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
