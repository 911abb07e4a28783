"""The offline model server: unit tests, and end-to-end runs of the real bundled Claude Code CLI
through ``claude_agent_sdk.query()`` against it (no network)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import psutil
import pytest

from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import (
    ModelServer,
    RequestRecord,
    ScriptError,
    compute_usage,
    generate_value,
    load_script,
    parse_directives,
    parse_markers,
)

sdk = pytest.importorskip("claude_agent_sdk")

from claude_agent_sdk import (  # noqa: E402
    AssistantMessage,
    ClaudeAgentOptions,
    ResultMessage,
    SystemMessage,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    query,
)
from claude_agent_sdk._errors import ResultError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)

REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "minLength": 10, "maxLength": 200},
        "severity": {"type": "string", "enum": ["low", "medium", "high"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "confidence": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "done": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "team": {"type": ["string", "null"]}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
    "required": ["summary", "severity", "score", "confidence", "done", "tags", "owner"],
    "additionalProperties": False,
}


def _key() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------------------------
# Schema-driven value generator
# --------------------------------------------------------------------------------------------

GENERATOR_SCHEMAS: list[dict[str, Any]] = [
    REPORT_SCHEMA,
    {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5},
    {"type": "integer", "minimum": 10, "multipleOf": 7},
    {"type": "number", "minimum": -2.5, "maximum": -2.4},
    {"type": "number", "multipleOf": 0.5, "minimum": 1, "maximum": 2},
    {"type": "string", "minLength": 300},
    {"type": "string", "maxLength": 3},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    {"type": "string", "pattern": "^(foo|bar)_\\d+$"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email"},
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 3},
        "minItems": 4,
        "uniqueItems": True,
    },
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
    {"type": "array", "maxItems": 0},
    {"const": {"fixed": True}},
    {"enum": [None, 3, "x"]},
    {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 50}]},
    {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "integer"}]},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer", "maximum": -5}}, "required": ["b"]},
        ]
    },
    {
        "$defs": {
            "item": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "minItems": 1},
                },
                "required": ["id", "children"],
            },
            "leaf": {"type": "string", "enum": ["x", "y"]},
        },
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 2}
        },
        "required": ["items"],
    },
    {"type": "object", "required": ["only_required"], "additionalProperties": {"type": "integer"}},
    {"type": "object", "minProperties": 2},
    {"properties": {"x": {"minimum": 5}}},
]


@pytest.mark.parametrize("schema", GENERATOR_SCHEMAS, ids=lambda s: json.dumps(s)[:50])
def test_generated_values_are_schema_valid(schema: dict[str, Any]) -> None:
    value = generate_value(schema, "Summarise the quarterly report for ACME")
    jsonschema.Draft202012Validator(schema).validate(value)


def test_generator_is_deterministic_and_mentions_the_prompt() -> None:
    prompt = "Summarise the quarterly report for ACME"
    a = generate_value(REPORT_SCHEMA, prompt)
    assert a == generate_value(REPORT_SCHEMA, prompt)
    assert "quarterly report" in a["summary"]
    assert "ACME" in a["owner"]["name"]
    assert len(a["tags"]) == 2
    other = generate_value(REPORT_SCHEMA, "Triage the failing login tests")
    assert "login" in other["summary"]


def test_generator_rejects_impossible_schema() -> None:
    with pytest.raises(ValueError):
        generate_value(False)


# --------------------------------------------------------------------------------------------
# Grammar and scripts
# --------------------------------------------------------------------------------------------


def test_marker_grammar_parses_every_directive() -> None:
    text = (
        "Do it [[model: key k1; fail 429 x2 retry-after 0.5; fail 529 x1 turn 1 no-retry]] now "
        '[[model: delay 1.5s; stall midstream x1 turn 2; output {"a": "]]; not the end"} x1; '
        'tool Bash {"command": "echo [[x]]"}; tool Read {"file_path": "/tmp/f"}; '
        "text all good here; usage input=10 output=2 cache_read=3 cache_creation=4]] please"
    )
    scn, rest = parse_markers(text)
    assert scn is not None
    assert rest == "Do it  now  please"
    assert scn.key == "k1"
    assert [(f.status, f.times, f.turn, f.retry_after, f.no_retry) for f in scn.failures] == [
        (429, 2, None, 0.5, False),
        (529, 1, 1, None, True),
    ]
    assert [(d.ms, d.turn) for d in scn.delays] == [(1500, None)]
    assert [(s.midstream, s.times, s.turn) for s in scn.stalls] == [(True, 1, 2)]
    assert scn.output == {"a": "]]; not the end"} and scn.output_times == 1
    assert [(t.name, t.input) for t in scn.tools] == [
        ("Bash", {"command": "echo [[x]]"}),
        ("Read", {"file_path": "/tmp/f"}),
    ]
    assert scn.text == "all good here"
    assert scn.usage == {
        "input_tokens": 10,
        "output_tokens": 2,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 4,
    }


def test_marker_without_key_uses_its_text() -> None:
    scn, _ = parse_markers("x [[model:  fail 500   x1 ]]")
    assert scn is not None and scn.key is None and scn.source == "fail 500 x1"
    assert parse_markers("no marker here") == (None, "no marker here")


@pytest.mark.parametrize(
    "bad",
    [
        "[[model: fail]]",
        "[[model: explode 3]]",
        "[[model: output nope]]",
        "[[model: tool Bash]]",
        "[[model: delay soon]]",
        "[[model: usage tokens=3]]",
        "[[model: fail 429 x2",
        '[[model: output {"a": ]]',
    ],
)
def test_marker_grammar_errors(bad: str) -> None:
    with pytest.raises(ScriptError):
        parse_markers(bad)


def test_script_files_json_and_yaml(tmp_path: Path) -> None:
    rules: list[dict[str, Any]] = [
        {"match": "report", "do": "fail 429 x1", "output": {"x": 1}},
        {
            "key": "tools",
            "tools": [{"name": "Bash", "input": {"command": "ls"}}],
            "fail": {"status": 500, "times": 2},
            "usage": {"input_tokens": 5},
        },
    ]
    json_path = tmp_path / "s.json"
    json_path.write_text(json.dumps({"rules": rules}))
    yaml_path = tmp_path / "s.yaml"
    yaml_path.write_text(
        "- match: report\n  do: fail 429 x1\n  output: {x: 1}\n"
        "- key: tools\n  tools: [{name: Bash, input: {command: ls}}]\n"
        "  fail: {status: 500, times: 2}\n  usage: {input_tokens: 5}\n"
    )
    for loaded in (load_script(json_path), load_script(yaml_path), load_script(rules)):
        assert [r.key for r in loaded] == ["report", "tools"]
        assert loaded[0].scenario.failures[0].status == 429
        assert loaded[0].scenario.output == {"x": 1}
        assert loaded[1].match is None and loaded[1].scenario.tools[0].name == "Bash"
        assert loaded[1].scenario.usage == {"input_tokens": 5}
    with pytest.raises(ScriptError):
        load_script([{"bogus": 1}])
    assert parse_directives("fail 401").failures[0].times is None


def test_usage_is_derived_from_request_size() -> None:
    first = compute_usage(4000, 2000, turn=0, output_chars=100)
    assert first == {
        "input_tokens": 500,
        "cache_creation_input_tokens": 500,
        "cache_read_input_tokens": 0,
        "output_tokens": 25,
    }
    later = compute_usage(4000, 2000, turn=1, output_chars=2)
    assert later["cache_read_input_tokens"] == 500 and later["cache_creation_input_tokens"] == 0
    assert later["output_tokens"] == 1


# --------------------------------------------------------------------------------------------
# HTTP behaviour (plain urllib, no CLI)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


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


# --------------------------------------------------------------------------------------------
# The real CLI through claude_agent_sdk.query()
# --------------------------------------------------------------------------------------------


def _options(
    srv: ModelServer,
    home: Path,
    *,
    schema: dict[str, Any] | None = REPORT_SCHEMA,
    max_retries: int | None = None,
    **kwargs: Any,
) -> ClaudeAgentOptions:
    return ClaudeAgentOptions(
        env=offline_claude_env(srv.url, home, max_retries=max_retries),
        output_format={"type": "json_schema", "schema": schema} if schema else None,
        max_turns=kwargs.pop("max_turns", 8),
        allowed_tools=kwargs.pop("allowed_tools", []),
        cwd=str(home),
        **kwargs,
    )


def _run(prompt: str, options: ClaudeAgentOptions, timeout: float = 60) -> list[Any]:
    """All messages of one query; an SDK exception is appended as the last item."""
    out: list[Any] = []

    async def go() -> None:
        with anyio.fail_after(timeout):
            try:
                async for message in query(prompt=prompt, options=options):
                    out.append(message)
            except ResultError as exc:
                out.append(exc)

    anyio.run(go)
    return out


def _result(messages: list[Any]) -> ResultMessage:
    results = [m for m in messages if isinstance(m, ResultMessage)]
    assert len(results) == 1, messages
    return results[0]


def _summed_usage(records: list[RequestRecord]) -> dict[str, int]:
    return {k: sum((r.usage or {}).get(k, 0) for r in records) for k in USAGE_KEYS}


@pytest.mark.timeout(120)
def test_cli_structured_output_is_schema_valid(
    server: ModelServer, tmp_path: Path, record_property: Any
) -> None:
    key = _key()
    t0 = time.monotonic()
    messages = _run(
        f"Assess the flaky deploy pipeline [[model: key {key}]]", _options(server, tmp_path)
    )
    elapsed = time.monotonic() - t0
    result = _result(messages)
    assert not result.is_error and result.subtype == "success"
    jsonschema.validate(result.structured_output, REPORT_SCHEMA)
    assert "flaky deploy pipeline" in result.structured_output["summary"]
    records = server.requests(key)
    assert records[0].outcome == "tool_use:StructuredOutput" and records[0].auth == "x-api-key"
    assert "StructuredOutput" in records[0].tool_names
    assert result.usage is not None
    assert {k: result.usage[k] for k in USAGE_KEYS} == _summed_usage(records)
    record_property("cli_query_seconds", round(elapsed, 2))


@pytest.mark.timeout(120)
def test_cli_retries_429_twice_then_succeeds(server: ModelServer, tmp_path: Path) -> None:
    key = _key()
    messages = _run(f"Retry me [[model: key {key}; fail 429 x2]]", _options(server, tmp_path))
    retries = [
        m.data for m in messages if isinstance(m, SystemMessage) and m.subtype == "api_retry"
    ]
    assert [(r["attempt"], r["error_status"]) for r in retries] == [(1, 429), (2, 429)]
    assert retries[0]["max_retries"] == 10  # the CLI's own default
    result = _result(messages)
    assert not result.is_error
    jsonschema.validate(result.structured_output, REPORT_SCHEMA)
    assert server.counts[key] == 3
    assert [r.status for r in server.requests(key)] == [429, 429, 200]


@pytest.mark.timeout(120)
def test_cli_failure_count_spans_processes_without_cli_retries(
    server: ModelServer, tmp_path: Path
) -> None:
    """With CLAUDE_CODE_MAX_RETRIES=0 each 429 ends the run; the count lives in the server."""
    key = _key()
    prompt = f"Count me [[model: key {key}; fail 429 x2]]"
    outcomes = []
    for i in range(3):
        messages = _run(prompt, _options(server, tmp_path / str(i), max_retries=0))
        result = _result(messages)
        outcomes.append((result.is_error, result.api_error_status))
        if result.is_error:
            assert isinstance(messages[-1], ResultError)
            assert messages[-1].api_error_status == 429
    assert outcomes == [(True, 429), (True, 429), (False, None)]
    assert server.counts[key] == 3


@pytest.mark.timeout(120)
def test_cli_reports_401(server: ModelServer, tmp_path: Path) -> None:
    """The CLI retries 401 too (10 times by default); ``no-retry`` (x-should-retry: false)
    makes it give up at once, as CLAUDE_CODE_MAX_RETRIES=0 would."""
    key = _key()
    messages = _run(f"Auth [[model: key {key}; fail 401 no-retry]]", _options(server, tmp_path))
    errors = [m.error for m in messages if isinstance(m, AssistantMessage) and m.error]
    assert errors == ["authentication_failed"]
    result = _result(messages)
    assert result.is_error and result.api_error_status == 401
    assert isinstance(messages[-1], ResultError)
    assert server.counts[key] == 1


@pytest.mark.timeout(120)
def test_cli_scripted_tool_calls_show_up(server: ModelServer, tmp_path: Path) -> None:
    key = _key()
    prompt = (
        f"Plan and check [[model: key {key}; "
        'tool TodoWrite {"todos": [{"content": "check", "status": "pending", '
        '"activeForm": "checking"}]}; tool Bash {"command": "echo offline-tool-ok"}]]'
    )
    messages = _run(prompt, _options(server, tmp_path, allowed_tools=["Bash"]))
    uses = [
        b
        for m in messages
        if isinstance(m, AssistantMessage)
        for b in m.content
        if isinstance(b, ToolUseBlock)
    ]
    assert [u.name for u in uses] == ["TodoWrite", "Bash", "StructuredOutput"]
    assert uses[1].input == {"command": "echo offline-tool-ok"}
    results = {
        b.tool_use_id: b
        for m in messages
        if isinstance(m, UserMessage) and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, ToolResultBlock)
    }
    # This CLI version has no TodoWrite tool: the call is traced and answered with an error.
    assert results[uses[0].id].is_error
    assert "offline-tool-ok" in str(results[uses[1].id].content)
    result = _result(messages)
    assert not result.is_error and result.num_turns == 4
    records = server.requests(key)
    assert [r.turn for r in records] == [0, 1, 2]
    assert result.usage is not None
    assert {k: result.usage[k] for k in USAGE_KEYS} == _summed_usage(records)
    assert records[1].usage is not None and records[1].usage["cache_read_input_tokens"] > 0


@pytest.mark.timeout(120)
def test_cli_schema_violation_then_recovery(server: ModelServer, tmp_path: Path) -> None:
    key = _key()
    messages = _run(
        f'Break it once [[model: key {key}; output {{"summary": 5}} x1]]',
        _options(server, tmp_path),
    )
    rejected = [
        b
        for m in messages
        if isinstance(m, UserMessage) and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.is_error
    ]
    assert len(rejected) == 1 and "schema" in str(rejected[0].content)
    result = _result(messages)
    assert not result.is_error
    jsonschema.validate(result.structured_output, REPORT_SCHEMA)


@pytest.mark.timeout(120)
def test_cli_stall_is_cancellable_and_server_stops_promptly(tmp_path: Path) -> None:
    srv = ModelServer().start()
    cancelled_after: list[float] = []

    async def go() -> None:
        with anyio.fail_after(90):
            await stalled_query()

    async def stalled_query() -> None:
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for _ in query(
                    prompt="Hang [[model: stall]]", options=_options(srv, tmp_path)
                ):
                    pass

            async def watchdog() -> None:
                seen = await anyio.to_thread.run_sync(
                    lambda: srv.wait_for(lambda r: r.outcome == "stall", timeout=60)
                )
                assert seen, "the CLI never reached the server"
                t0 = time.monotonic()
                tg.cancel_scope.cancel()
                cancelled_after.append(t0)

            tg.start_soon(consume)
            tg.start_soon(watchdog)

    try:
        anyio.run(go)
    finally:
        t0 = time.monotonic()
        srv.stop()
        stop_seconds = time.monotonic() - t0
    assert cancelled_after, "query finished without stalling"
    assert stop_seconds < 2
    leftovers = [
        p
        for p in psutil.Process(os.getpid()).children(recursive=True)
        if "claude" in " ".join(p.cmdline())
    ]
    assert leftovers == []
