"""A stand-in for the ECS container agent's task scale-in protection endpoint.

On ECS every task gets `ECS_AGENT_URI`; `PUT $ECS_AGENT_URI/task-protection/v1/state`
with `{"ProtectionEnabled": bool, "ExpiresInMinutes": 1..2880}` (default 120 minutes)
sets protection and answers `{"protection": {"ExpirationDate", "ProtectionEnabled",
"TaskArn"}}`; `GET` answers the current state, which lapses by itself at its
expiration. A change ECS refuses is answered `{"failure": {"Arn", "Reason", "Detail"}}`,
an API error `{"error": {"Arn", "Code", "Message"}}` with the error's HTTP status.

One stand-in serves many workers: each gets its own URI (`uri_for(task_id)`, as each
ECS task has its own). Failures on demand: `fail_next(task_id, count, kind)` in
process, or `POST <task uri>/agentq/fail {"count": n, "kind": "failure"|"error"}` from
another process. The local stack starts one for its workers.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal

PROTECTION_PATH: Final = "/task-protection/v1/state"
FAIL_PATH: Final = "/agentq/fail"
DEFAULT_MINUTES: Final = 120
MAX_MINUTES: Final = 2_880
FailureKind = Literal["failure", "error"]


class EcsAgentStandIn:
    """`EcsAgentStandIn().start()` … `.stop()`; also a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._expires_at: dict[str, float] = {}  # task id -> epoch seconds; absent: off
        self._failures: dict[str, list[FailureKind]] = defaultdict(list)
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def uri_for(self, task_id: str) -> str:
        return f"{self.url}/api/{task_id}"

    def start(self) -> EcsAgentStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> EcsAgentStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_next(self, task_id: str, count: int = 1, kind: FailureKind = "failure") -> None:
        with self._lock:
            self._failures[task_id].extend([kind] * count)

    def protected(self, task_id: str) -> bool:
        with self._lock:
            return self._expires_at.get(task_id, 0.0) > time.time()

    def puts(self, task_id: str) -> list[dict[str, Any]]:
        """The bodies of the PUTs this task sent, answered or refused, in order."""
        with self._lock:
            return [r["body"] for r in self.requests[task_id] if r["method"] == "PUT"]

    # -- what the agent answers ---------------------------------------------------------
    def answer(self, method: str, task_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        arn = f"arn:aws:ecs:local:000000000000:task/agentq-local/{task_id}"
        with self._lock:
            self.requests[task_id].append({"method": method, "body": body})
            if method == "GET":
                return 200, {"protection": self._state(arn, task_id)}
            problem = _invalid(body)
            if problem:
                return 400, {"error": {"Arn": arn, "Code": "InvalidParameterException",
                                       "Message": problem}}  # fmt: skip
            pending = self._failures[task_id]
            if pending:
                if pending.pop(0) == "error":
                    return 500, {"error": {"Arn": arn, "Code": "ServerException",
                                           "Message": "injected by the stand-in"}}  # fmt: skip
                return 200, {"failure": {"Arn": arn, "Reason": "TASK_NOT_VALID",
                                         "Detail": "injected by the stand-in"}}  # fmt: skip
            if body["ProtectionEnabled"]:
                minutes = body.get("ExpiresInMinutes", DEFAULT_MINUTES)
                self._expires_at[task_id] = time.time() + minutes * 60
            else:
                self._expires_at.pop(task_id, None)
            return 200, {"protection": self._state(arn, task_id)}

    def _state(self, arn: str, task_id: str) -> dict[str, Any]:
        expires = self._expires_at.get(task_id, 0.0)
        if expires <= time.time():
            return {"ExpirationDate": None, "ProtectionEnabled": False, "TaskArn": arn}
        when = datetime.fromtimestamp(expires, UTC).isoformat(timespec="milliseconds")
        return {"ExpirationDate": when.replace("+00:00", "Z"), "ProtectionEnabled": True,
                "TaskArn": arn}  # fmt: skip


def _invalid(body: Any) -> str:
    if not isinstance(body, dict) or not isinstance(body.get("ProtectionEnabled"), bool):
        return "ProtectionEnabled (a boolean) is required"
    minutes = body.get("ExpiresInMinutes")
    if minutes is not None and (
        not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MAX_MINUTES
    ):
        return f"ExpiresInMinutes must be an integer from 1 to {MAX_MINUTES}"
    return ""


def _handler_for(agent: EcsAgentStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._route("GET")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_POST(self) -> None:
            self._route("POST")

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            parts = path.split("/", 3)  # "", "api", task id, rest
            if len(parts) < 4 or parts[1] != "api" or not parts[2]:
                return self._reply(404, {"error": {"Code": "NotFound", "Message": path}})
            task_id, rest = parts[2], "/" + parts[3]
            body = self._body()
            if method == "POST" and rest == FAIL_PATH and isinstance(body, dict):
                kind: FailureKind = "error" if body.get("kind") == "error" else "failure"
                agent.fail_next(task_id, int(body.get("count", 1)), kind)
                return self._reply(200, {})
            if rest != PROTECTION_PATH or method == "POST":
                return self._reply(404, {"error": {"Code": "NotFound", "Message": path}})
            status, answer = agent.answer(method, task_id, body)
            return self._reply(status, answer)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                return json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                return None

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
