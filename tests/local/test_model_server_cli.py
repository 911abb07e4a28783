"""The real bundled Claude Code CLI via ``claude_agent_sdk.query()`` against the model server."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import jsonschema
import psutil
import pytest
from _model_server_common import (  # noqa: F401 (fixture_server: the server fixture)
    REPORT_SCHEMA,
    USAGE_KEYS,
    _key,
    fixture_server,
)
from support import LazyModule

from agentq.local.claude_env import offline_claude_env
from agentq.local.model_server import ModelServer, RequestRecord

# Imported on first use: every test process collects this module, one runs it.
if TYPE_CHECKING:
    import claude_agent_sdk as sdk
else:
    sdk = LazyModule("claude_agent_sdk")

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
) -> sdk.ClaudeAgentOptions:
    return sdk.ClaudeAgentOptions(
        env=offline_claude_env(srv.url, home, max_retries=max_retries),
        output_format={"type": "json_schema", "schema": schema} if schema else None,
        max_turns=kwargs.pop("max_turns", 8),
        allowed_tools=kwargs.pop("allowed_tools", []),
        cwd=str(home),
        **kwargs,
    )


def _run(prompt: str, options: sdk.ClaudeAgentOptions, timeout: float = 60) -> list[Any]:
    """All messages of one query; an SDK exception is appended as the last item."""
    out: list[Any] = []

    async def go() -> None:
        with anyio.fail_after(timeout):
            try:
                async for message in sdk.query(prompt=prompt, options=options):
                    out.append(message)
            except sdk.ResultError as exc:
                out.append(exc)

    anyio.run(go)
    return out


def _result(messages: list[Any]) -> sdk.ResultMessage:
    results = [m for m in messages if isinstance(m, sdk.ResultMessage)]
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
        m.data for m in messages if isinstance(m, sdk.SystemMessage) and m.subtype == "api_retry"
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
            assert isinstance(messages[-1], sdk.ResultError)
            assert messages[-1].api_error_status == 429
    assert outcomes == [(True, 429), (True, 429), (False, None)]
    assert server.counts[key] == 3


@pytest.mark.timeout(120)
def test_cli_reports_401(server: ModelServer, tmp_path: Path) -> None:
    """The CLI retries 401 too (10 times by default); ``no-retry`` (x-should-retry: false)
    makes it give up at once, as CLAUDE_CODE_MAX_RETRIES=0 would."""
    key = _key()
    messages = _run(f"Auth [[model: key {key}; fail 401 no-retry]]", _options(server, tmp_path))
    errors = [m.error for m in messages if isinstance(m, sdk.AssistantMessage) and m.error]
    assert errors == ["authentication_failed"]
    result = _result(messages)
    assert result.is_error and result.api_error_status == 401
    assert isinstance(messages[-1], sdk.ResultError)
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
        if isinstance(m, sdk.AssistantMessage)
        for b in m.content
        if isinstance(b, sdk.ToolUseBlock)
    ]
    assert [u.name for u in uses] == ["TodoWrite", "Bash", "StructuredOutput"]
    assert uses[1].input == {"command": "echo offline-tool-ok"}
    results = {
        b.tool_use_id: b
        for m in messages
        if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, sdk.ToolResultBlock)
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
        if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, sdk.ToolResultBlock) and b.is_error
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
                async for _ in sdk.query(
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
