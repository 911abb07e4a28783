"""A local stand-in for the Slack Web API: `chat.postMessage` and `auth.test`, over HTTP.

Point slack-sdk's `WebClient(base_url=standin.base_url)` (or SLACK_API_URL) at it. It
checks the bearer token, records every request, and can be told to answer the next N
calls with 429 and a Retry-After header, as Slack does when rate limiting. Like Slack,
it refuses a message whose blocks break Block Kit's limits (more than 50 blocks, a text
too long) with `invalid_blocks`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

# Block Kit's documented limits, in characters as Slack's reference states them.
_MAX_BLOCKS: Final = 50
_MAX_ITEMS: Final = 10  # a section's fields, a context's elements
_HEADER_TEXT_MAX: Final = 150
_SECTION_TEXT_MAX: Final = 3000
_FIELD_TEXT_MAX: Final = 2000
_TEXT_MAX: Final = 3000  # any other text object


def blocks_error(blocks: object) -> str | None:
    """Slack's error for a message with these blocks; None if it would accept them."""
    if blocks is None:
        return None
    if not isinstance(blocks, list) or not 0 < len(blocks) <= _MAX_BLOCKS:
        return "invalid_blocks"
    return None if all(_block_ok(block) for block in blocks) else "invalid_blocks"


def _block_ok(block: Any) -> bool:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "header":
        return _text_ok(block.get("text"), _HEADER_TEXT_MAX)
    if kind == "section":
        fields = block.get("fields") or []
        return (
            ("text" in block or bool(fields))
            and ("text" not in block or _text_ok(block["text"], _SECTION_TEXT_MAX))
            and len(fields) <= _MAX_ITEMS
            and all(_text_ok(field, _FIELD_TEXT_MAX) for field in fields)
        )
    if kind == "context":
        elements = block.get("elements") or []
        return 0 < len(elements) <= _MAX_ITEMS and all(
            _text_ok(element, _TEXT_MAX)
            for element in elements
            if not (isinstance(element, dict) and element.get("type") == "image")
        )
    return kind is not None  # dividers; other kinds (agentq sends none) go unchecked


def _text_ok(obj: object, most: int) -> bool:
    text = obj.get("text") if isinstance(obj, dict) else None
    return isinstance(text, str) and 0 < len(text) <= most


@dataclass(frozen=True)
class RecordedRequest:
    method: str  # the Slack method, e.g. "chat.postMessage"
    status: int  # what the stand-in answered
    headers: dict[str, str]
    payload: dict[str, Any]
    ok: bool  # Slack's own verdict ("ok" in the answer)
    at: float = field(default_factory=time.monotonic)


class SlackStandIn:
    def __init__(self, *, valid_tokens: frozenset[str] | None = None) -> None:
        self._valid = valid_tokens  # None: any xoxb- token is accepted
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._rate_limited = 0
        self._dropped = 0
        self._retry_after_s = 1
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------
    def rate_limit(self, times: int, *, retry_after_s: int = 1) -> None:
        """Answer the next `times` calls with HTTP 429 and `Retry-After`."""
        with self._lock:
            self._rate_limited = times
            self._retry_after_s = retry_after_s

    def drop_connections(self, times: int) -> None:
        """Close the connection of the next `times` calls without answering them."""
        with self._lock:
            self._dropped = times

    def _drop(self) -> bool:
        with self._lock:
            if self._dropped > 0:
                self._dropped -= 1
                return True
            return False

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def messages(self) -> list[dict[str, Any]]:
        """Payloads of chat.postMessage calls that were accepted."""
        return [r.payload for r in self.requests if r.method == "chat.postMessage" and r.ok]

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the Slack stand-in is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/api/"

    def start(self) -> SlackStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="slack-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> SlackStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -------------------------------------------------------------------
    def _answer(self, method: str, headers: dict[str, str], payload: dict[str, Any]
                ) -> tuple[int, dict[str, str], dict[str, Any]]:  # fmt: skip
        with self._lock:
            if self._rate_limited > 0:
                self._rate_limited -= 1
                retry = {"Retry-After": str(self._retry_after_s)}
                self._record(method, 429, headers, payload, ok=False)
                return 429, retry, {"ok": False, "error": "ratelimited"}
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        token = token or str(payload.get("token") or "")
        accepted = token in self._valid if self._valid is not None else token.startswith("xoxb-")
        if not accepted:
            self._record(method, 200, headers, payload, ok=False)
            return 200, {}, {"ok": False, "error": "invalid_auth"}
        if method == "auth.test":
            body: dict[str, Any] = {"ok": True, "team": "local", "user": "agentq", "bot_id": "B1"}
        elif method == "chat.postMessage":
            if not payload.get("channel"):
                body = {"ok": False, "error": "channel_not_found"}
            elif error := blocks_error(payload.get("blocks")):
                body = {"ok": False, "error": error}
            else:
                body = {"ok": True, "channel": payload["channel"], "ts": f"{time.time():.6f}",
                        "message": {"text": payload.get("text"), "blocks": payload.get("blocks")}}  # fmt: skip
        else:
            body = {"ok": False, "error": "unknown_method"}
        with self._lock:
            self._record(method, 200, headers, payload, ok=bool(body["ok"]))
        return 200, {}, body

    def _record(
        self,
        method: str,
        status: int,
        headers: dict[str, str],
        payload: dict[str, Any],
        *,
        ok: bool,
    ) -> None:
        self._requests.append(RecordedRequest(method, status, headers, payload, ok))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                content_type = self.headers.get("Content-Type", "")
                payload: dict[str, Any]
                if "json" in content_type:
                    payload = json.loads(raw or "{}")
                else:
                    payload = {k: v[-1] for k, v in urllib.parse.parse_qs(raw).items()}
                    # Form posts carry Block Kit as a JSON string.
                    if isinstance(payload.get("blocks"), str):
                        payload["blocks"] = json.loads(payload["blocks"])
                method = self.path.rsplit("/", 1)[-1].split("?", 1)[0]
                headers = {k.lower(): v for k, v in self.headers.items()}
                if standin._drop():
                    standin._record(method, 0, headers, payload, ok=False)
                    self.close_connection = True
                    return  # the client sees the connection closed with no answer
                status, extra, body = standin._answer(method, headers, payload)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read `requests`, not stderr

        return Handler
