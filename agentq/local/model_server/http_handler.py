"""The HTTP side: routes, JSON and SSE answers, scripted failures, stalls and delays.

The handler reaches its server's state only through `Host` (implemented by
`ModelServer`), so this module does not import the server that imports it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import uuid
import zlib
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from agentq.local.model_server.request import Request, compute_usage, pick_failure, plan_turn
from agentq.local.model_server.scenario import (
    DEFAULT_MODEL,
    ERROR_MESSAGES,
    ERROR_TYPES,
    SSE_CHUNK,
    RequestRecord,
    Scenario,
    ScriptError,
)


class Stopped(Exception):
    """The server is stopping: abandon the request."""


class Host(Protocol):
    """What the handler needs of the server that owns it (`ModelServer`)."""

    verbose: bool

    def track(self, conn: socket.socket, *, add: bool) -> None: ...

    def sleep(self, seconds: float | None) -> None: ...

    def scenario_for(self, req: Request) -> tuple[Scenario, str, str]: ...

    def count_request(self, key: str, turn: int) -> tuple[int, int]: ...

    def new_record(self, **kwargs: Any) -> RequestRecord: ...

    def finish_record(
        self,
        rec: RequestRecord,
        *,
        status: int,
        outcome: str,
        usage: dict[str, int] | None = None,
        content: list[dict[str, Any]] | None = None,
    ) -> None: ...


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: Host) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "agentq-offline-model/1"

    # ---- plumbing ------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.server.owner.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner.track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.owner.verbose:
            super().log_message(format, *args)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length > 0 else b""
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        if encoding == "gzip":
            data = gzip.decompress(data)
        elif encoding == "deflate":
            data = zlib.decompress(data)
        return data

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", f"req_offline_{uuid.uuid4().hex[:20]}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error_json(
        self, status: int, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        body = {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": f"req_offline_{uuid.uuid4().hex[:20]}",
        }
        self._send_json(status, body, headers)

    def _record(self, **kwargs: Any) -> RequestRecord:
        return self.server.owner.new_record(
            method=self.command,
            path=self.path,
            retry_count=self.headers.get("x-stainless-retry-count"),
            user_agent=self.headers.get("User-Agent"),
            auth=(
                "x-api-key"
                if self.headers.get("x-api-key")
                else "bearer"
                if (self.headers.get("Authorization") or "").lower().startswith("bearer ")
                else "none"
            ),
            **kwargs,
        )

    # ---- verbs ---------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._record(status=200, outcome="probe")
        self._send_json(200, {})

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path in ("/", "/health", "/healthz"):
            self._record(status=200, outcome="probe")
            self._send_json(200, {"status": "ok", "service": "agentq offline model server"})
        elif path == "/v1/models":
            self._record(status=200, outcome="models")
            model = {
                "type": "model",
                "id": DEFAULT_MODEL,
                "display_name": "Offline model server",
                "created_at": "2024-01-01T00:00:00Z",
            }
            self._send_json(
                200,
                {
                    "data": [model],
                    "has_more": False,
                    "first_id": model["id"],
                    "last_id": model["id"],
                },
            )
        else:
            self._record(status=404, outcome="not-found")
            self._send_error_json(404, f"no route for GET {path} (offline model server)")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        try:
            raw = self._read_body()
            body = json.loads(raw or b"{}")
        except (ValueError, OSError, EOFError) as exc:
            self._record(status=400, outcome="bad-request")
            self._send_error_json(400, f"could not read JSON body: {exc}")
            return
        if path == "/v1/messages/count_tokens":
            self._record(status=200, outcome="count_tokens")
            self._send_json(200, {"input_tokens": max(1, len(raw) // 4)})
        elif path == "/v1/messages" and isinstance(body, dict):
            try:
                self._messages(body, len(raw))
            except (Stopped, BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            except Exception as exc:  # a bug or an unsupported schema: tell the client, once
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self._send_error_json(
                        500,
                        f"offline model server failed: {type(exc).__name__}: {exc}",
                        {"x-should-retry": "false"},
                    )
        else:
            self._record(status=404, outcome="not-found")
            self._send_error_json(404, f"no route for POST {path} (offline model server)")

    def do_PUT(self) -> None:
        self.do_GET()

    def do_PATCH(self) -> None:
        self.do_GET()

    def do_DELETE(self) -> None:
        self.do_GET()

    # ---- /v1/messages --------------------------------------------------------------------

    def _messages(self, body: dict[str, Any], raw_size: int) -> None:
        owner = self.server.owner
        req = Request.parse(body, raw_size)
        stream = bool(body.get("stream"))
        try:
            scn, key, prompt = owner.scenario_for(req)
        except ScriptError as exc:
            self._record(status=400, outcome="script-error", stream=stream, prompt=req.prompt)
            self._send_error_json(400, f"offline model server script error: {exc}")
            return
        attempt, turn_attempt = owner.count_request(key, req.turn)
        rec = self._record(
            key=key,
            attempt=attempt,
            turn=req.turn,
            stream=stream,
            model=body.get("model"),
            tool_names=list(req.tools),
            prompt=prompt,
            latest_prompt=req.latest_prompt,
        )

        for d in scn.delays:
            if d.turn is None or d.turn == req.turn:
                owner.sleep(d.ms / 1000)

        for st in scn.stalls:
            if st.turn is not None and st.turn != req.turn:
                continue
            n = turn_attempt if st.turn is not None else attempt
            if st.times is not None and n > st.times:
                continue
            owner.finish_record(
                rec, status=0, outcome="stall-midstream" if st.midstream else "stall"
            )
            if st.midstream and stream:
                self._start_sse()
                self._sse(
                    "message_start",
                    {
                        "type": "message_start",
                        "message": self._message(
                            body, [], None, {"input_tokens": 1, "output_tokens": 1}
                        ),
                    },
                )
            owner.sleep(None)
            raise Stopped

        failure = pick_failure(scn.failures, attempt, req.turn, turn_attempt)
        if failure is not None:
            headers: dict[str, str] = {}
            if failure.retry_after is not None:
                headers["retry-after"] = f"{failure.retry_after:g}"
            if failure.no_retry:
                headers["x-should-retry"] = "false"
            owner.finish_record(rec, status=failure.status, outcome=f"error:{failure.status}")
            message = ERROR_MESSAGES.get(
                failure.status, f"Scripted HTTP {failure.status} (offline model server)"
            )
            self._send_error_json(failure.status, message, headers)
            return

        content, stop_reason = plan_turn(scn, req, prompt, key)
        out_chars = len(json.dumps(content))
        usage = compute_usage(req.raw_size, req.cacheable_chars, req.turn, out_chars)
        usage.update(scn.usage)
        outcome = ",".join(
            f"tool_use:{b['name']}" if b["type"] == "tool_use" else str(b["type"]) for b in content
        )
        owner.finish_record(rec, status=200, outcome=outcome, usage=usage, content=content)
        if stream:
            self._stream(body, content, stop_reason, usage)
        else:
            self._send_json(200, self._message(body, content, stop_reason, usage))

    def _message(
        self,
        body: Mapping[str, Any],
        content: list[dict[str, Any]],
        stop_reason: str | None,
        usage: Mapping[str, int],
    ) -> dict[str, Any]:
        return {
            "id": f"msg_offline_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or DEFAULT_MODEL,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": dict(usage),
        }

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("request-id", f"req_offline_{uuid.uuid4().hex[:20]}")
        self.end_headers()
        self.close_connection = True

    def _sse(self, event: str, data: Mapping[str, Any]) -> None:
        self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(
        self,
        body: Mapping[str, Any],
        content: list[dict[str, Any]],
        stop_reason: str,
        usage: Mapping[str, int],
    ) -> None:
        self._start_sse()
        start_usage = {**usage, "output_tokens": 1}
        self._sse(
            "message_start",
            {"type": "message_start", "message": self._message(body, [], None, start_usage)},
        )
        for index, block in enumerate(content):
            if block["type"] == "tool_use":
                start = {**block, "input": {}}
                payload = json.dumps(block["input"])
                delta_type, delta_key = "input_json_delta", "partial_json"
            else:
                start = {"type": "text", "text": ""}
                payload = str(block["text"])
                delta_type, delta_key = "text_delta", "text"
            self._sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            for chunk in _chunks(payload):
                self._sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": delta_type, delta_key: chunk},
                    },
                )
            self._sse("content_block_stop", {"type": "content_block_stop", "index": index})
        self._sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": dict(usage),
            },
        )
        self._sse("message_stop", {"type": "message_stop"})


def _chunks(text: str) -> Iterator[str]:
    if not text:
        yield ""
        return
    for i in range(0, len(text), SSE_CHUNK):
        yield text[i : i + SSE_CHUNK]
