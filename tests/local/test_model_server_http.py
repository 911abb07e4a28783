"""The offline model server over plain HTTP (no CLI), its ``main`` and the CLI's offline env."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
from _model_server_common import (  # noqa: F401 (fixture_server: the server fixture)
    REPORT_SCHEMA,
    USAGE_KEYS,
    _key,
    fixture_server,
)

from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------
# HTTP behaviour (plain urllib, no CLI)
# --------------------------------------------------------------------------------------------


def _post(
    srv: ModelServer, body: dict[str, Any], path: str = "/v1/messages"
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        srv.url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": "k"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _body(
    prompt: str, *, stream: bool = False, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 100,
        "stream": stream,
        "system": [{"type": "text", "text": "You are a test."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
    }
    if schema is not None:
        body["tools"] = [{"name": "StructuredOutput", "input_schema": schema}]
    return body


def _sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk.strip():
            continue
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_non_streaming_structured_output_then_final_text(server: ModelServer) -> None:
    body = _body("Rate the release notes", schema=REPORT_SCHEMA)
    status, _, raw = _post(server, body)
    assert status == 200
    msg = json.loads(raw)
    assert msg["type"] == "message" and msg["stop_reason"] == "tool_use"
    (block,) = msg["content"]
    assert block["name"] == "StructuredOutput"
    jsonschema.validate(block["input"], REPORT_SCHEMA)
    assert set(USAGE_KEYS) <= set(msg["usage"])
    body["messages"] += [
        {"role": "assistant", "content": msg["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "ok"}],
        },
    ]
    status, _, raw = _post(server, body)
    final = json.loads(raw)
    assert final["stop_reason"] == "end_turn" and final["content"][0]["type"] == "text"


def test_streaming_events_and_usage(server: ModelServer) -> None:
    key = _key()
    body = _body(
        f'Stream please [[model: key {key}; tool Bash {{"command": "ls -la /tmp"}}]]', stream=True
    )
    status, headers, raw = _post(server, body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = _sse_events(raw)
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and "content_block_stop" in names
    partial = "".join(d["delta"]["partial_json"] for e, d in events if e == "content_block_delta")
    assert json.loads(partial) == {"command": "ls -la /tmp"}
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    (rec,) = server.requests(key)
    assert rec.usage == delta["usage"] and rec.stream and rec.outcome == "tool_use:Bash"
    # Same request, same numbers.
    _post(server, body)
    assert server.requests(key)[1].usage == rec.usage


def test_errors_have_anthropic_shape_and_count_per_key(server: ModelServer) -> None:
    key = _key()
    body = _body(f"x [[model: key {key}; fail 429 x2 retry-after 7; fail 529 x1]]")
    results = [_post(server, body) for _ in range(4)]
    assert [r[0] for r in results] == [429, 429, 529, 200]
    err = json.loads(results[0][2])
    assert err["type"] == "error" and err["error"]["type"] == "rate_limit_error"
    assert results[0][1]["retry-after"] == "7"
    assert json.loads(results[2][2])["error"]["type"] == "overloaded_error"
    assert server.counts[key] == 4
    assert [r.status for r in server.requests(key)] == [429, 429, 529, 200]


def test_probes_and_unknown_routes(server: ModelServer) -> None:
    status, _, raw = _post(server, _body("count me"), "/v1/messages/count_tokens?beta=true")
    assert status == 200 and json.loads(raw)["input_tokens"] > 0
    with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as resp:
        assert json.loads(resp.read())["data"][0]["type"] == "model"
    head = urllib.request.Request(server.url + "/", method="HEAD")
    with urllib.request.urlopen(head, timeout=5) as resp:
        assert resp.status == 200
    status, _, raw = _post(server, {}, "/v1/complete")
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    status, _, raw = _post(server, _body("[[model: fail]]"))
    assert status == 400 and "script error" in json.loads(raw)["error"]["message"]
    # A schema the generator cannot satisfy: a 500 the CLI is told not to retry.
    status, headers, raw = _post(
        server, _body("x", schema={"type": "object", "properties": {"never": {"enum": []}}})
    )
    assert status == 500 and headers["x-should-retry"] == "false"
    assert "empty enum" in json.loads(raw)["error"]["message"]


def test_delay_and_stall_release_on_stop() -> None:
    with ModelServer() as srv:
        t0 = time.monotonic()
        status, _, _ = _post(srv, _body("[[model: delay 300ms; text hi]]"))
        assert status == 200 and time.monotonic() - t0 >= 0.3
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        data = json.dumps(_body("[[model: stall]]")).encode()
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        assert srv.wait_for(lambda r: r.outcome == "stall", timeout=10)
        t0 = time.monotonic()
        srv.stop()
        assert time.monotonic() - t0 < 2
        assert sock.recv(100) == b""  # closed without an answer
        sock.close()


def test_rules_apply_to_matching_prompts() -> None:
    with ModelServer(script=[{"match": "needle", "key": "rule-k", "do": "text from rule"}]) as srv:
        _, _, raw = _post(srv, _body("find the needle"))
        assert json.loads(raw)["content"][0]["text"] == "from rule"
        _post(srv, _body("find the needle [[model: text marker wins]]"))
        _, _, raw = _post(srv, _body("hay only"))
        assert json.loads(raw)["content"][0]["text"].startswith("Offline model answer to: hay")
        assert srv.counts == {"rule-k": 2, "default": 1}
        assert srv.requests("rule-k")[1].response_content[0]["text"] == "marker wins"


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "rules.json"
    script.write_text(json.dumps([{"do": "text scripted"}]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentq.local.model_server", "--port", "0", "--script", str(script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        req = urllib.request.Request(
            url + "/v1/messages", data=json.dumps(_body("hi")).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["content"][0]["text"] == "scripted"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_offline_claude_env(tmp_path: Path) -> None:
    env = offline_claude_env("http://127.0.0.1:1/", tmp_path / "h", max_retries=0)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1"
    assert env["HOME"] == str(tmp_path / "h")
    assert Path(env["CLAUDE_CONFIG_DIR"]).is_dir()
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert env["ANTHROPIC_AUTH_TOKEN"] == ""
    assert "API_TIMEOUT_MS" not in env
