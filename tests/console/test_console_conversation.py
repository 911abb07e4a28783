"""The task page's Conversation section in Debian's headless chromium: a resumed task's
two attempts, where it resumed, and hostile text drawn as text.

The checkpoints are the real CLI's (tests/unit/fixtures: killed after two turns, resumed
by attempt 2), placed where the worker puts them; a follow-up turn carries markup and a
script that would set `window.__xss` if the page ever parsed it as HTML.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from console_support import browser, running_console, signed_in
from playwright.sync_api import Browser

from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.store.codec import to_item
from agentq.store.keys import STATE_SK, attempt_prefix, checkpoint_key, task_pk
from agentq.store.tenants import TenantLimitStore

__all__ = ["browser"]
pytestmark = [pytest.mark.timeout(120)]

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures"
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def _task(stack: Stack, request_id: str, tenant: str = "acme", **envelope: Any) -> None:
    item = {"PK": task_pk(tenant, request_id), "SK": STATE_SK, "requestId": request_id,
            "tenant": tenant, "state": "COMPLETED", "attempt": 2, "definition": "chat",
            "envelope": {"requestId": request_id, "tenant": tenant, "definition": "chat",
                         **envelope}}  # fmt: skip
    stack.dynamodb.put_item(TableName=stack.resources.table_name, Item=to_item(item))
    follow_up = {"type": "user", "uuid": "hostile-follow-up",
                 "sessionId": "6c4b69e6-f484-42f2-a2ee-2b40c1fccf7e",
                 "message": {"role": "user", "content": HOSTILE}}  # fmt: skip
    for attempt, extra in ((1, b""), (2, json.dumps(follow_up).encode() + b"\n")):
        body = (FIXTURES / f"resumed-attempt-{attempt}.jsonl").read_bytes() + extra
        stack.s3.put_object(Bucket=stack.resources.bucket,
                            Key=checkpoint_key(tenant, request_id, attempt), Body=body)  # fmt: skip


def test_a_resumed_tasks_page_shows_both_attempts_the_resume_and_hostile_text_as_text(
    stack: Stack, browser: Browser
) -> None:
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="chat", kind="agent", settings={
            "prompt": "{text}", "resume": True, "output_schema": {"type": "object"}})
    )  # fmt: skip
    _task(stack, "r-resumed")
    _task(stack, "r-own-off", resume=False)  # the task turned its definition's resume off
    _task(stack, "r-hush", tenant="hush")
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set_transcripts(
        "hush", stored=False
    )
    with running_console() as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/tasks/r-resumed?tenant=acme")
        page.wait_for_selector("#conversation[data-loaded='1']", timeout=20_000)
        boundaries = page.eval_on_selector_all(
            "#conversation h3.attempt-boundary", "nodes => nodes.map(n => n.textContent)"
        )
        turns = page.eval_on_selector_all(
            "#conversation .turn",
            "nodes => nodes.map(n => [n.dataset.attempt, n.dataset.kind, n.textContent])",
        )
        marker = page.text_content("#conversation .resume-marker")
        follow_up = page.eval_on_selector(
            "#conversation .turn.follow_up pre", "n => [n.textContent, n.children.length]"
        )
        injected = page.evaluate("() => [window.__xss, document.querySelectorAll('#conversation img, #conversation script').length]")  # fmt: skip
        rows = "nodes => nodes.map(n => [n.textContent, n.nextElementSibling.textContent])"
        resume_rows = [dict(page.eval_on_selector_all("dl.kv dt", rows)).get("resume on retry")]

        page.goto(f"{server.base_url}/tasks/r-own-off?tenant=acme")
        page.wait_for_selector("#conversation[data-loaded='1']", timeout=20_000)
        resume_rows.append(dict(page.eval_on_selector_all("dl.kv dt", rows)).get("resume on retry"))
        own_off = page.text_content("#conversation")

        page.goto(f"{server.base_url}/tasks/r-hush?tenant=hush")
        page.wait_for_selector("#conversation[data-loaded='1']", timeout=20_000)
        hushed = page.text_content("#conversation")

    assert boundaries == [
        "Attempt 1", "Attempt 2 · resumed from an earlier attempt's checkpoint",
    ]  # fmt: skip
    assert {a for a, _, _ in turns} == {"1", "2"}
    assert [k for a, k, _ in turns if a == "1"][:3] == ["prompt", "assistant", "tool_results"]
    assert next(k for a, k, _ in turns if a == "2") == "resume"
    assert any("echo step-1" in text for a, _, text in turns if a == "1")
    assert any("echo step-3" in text for a, k, text in turns if a == "2" and k == "assistant")
    assert marker == "↻ resumed here"
    assert follow_up == [HOSTILE, 0]  # the markup as text, no element made of it
    assert injected == [None, 0]
    # Only a task that set its own resume says so (its stored conversation still shows).
    assert resume_rows == [None, "off for this task"]
    assert "echo step-1" in (own_off or "")
    assert "no conversation stored (tenant hush does not store transcripts)" in (hushed or "")
    assert "echo step-1" not in (hushed or "")


def test_a_completed_tasks_page_continues_its_session_with_a_follow_up(
    stack: Stack, browser: Browser
) -> None:
    """The Continue form of a COMPLETED agent task whose final session is stored: the
    follow-up, hostile text included, becomes a new task that continues it; a task with no
    stored session offers no form."""
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="chat", kind="agent", settings={
            "prompt": "{text}", "resume": True, "output_schema": {"type": "object"}})
    )  # fmt: skip
    _task(stack, "r-source")
    _task(stack, "r-no-session")
    final = checkpoint_key("acme", "r-source", 2)
    stack.dynamodb.update_item(
        TableName=stack.resources.table_name, Key=to_item({"PK": task_pk("acme", "r-source"),
                                                           "SK": STATE_SK}),
        # As the worker leaves it: the result and the final session, in attempt 2's folder.
        UpdateExpression="SET #c = :c, #r = :r",
        ExpressionAttributeNames={"#c": "checkpoint", "#r": "result"},
        ExpressionAttributeValues=to_item({
            ":c": {"bucket": stack.resources.bucket, "key": final},
            ":r": {"bucket": stack.resources.bucket,
                   "key": attempt_prefix("acme", "r-source", 2) + "result.json"}}),
    )  # fmt: skip
    with running_console(allow_actions=True) as server:
        page = signed_in(browser, server)
        page.goto(f"{server.base_url}/tasks/r-no-session?tenant=acme")
        page.wait_for_selector("#conversation[data-loaded='1']", timeout=20_000)
        offered_without_session = page.query_selector("#continue") is not None
        page.goto(f"{server.base_url}/tasks/r-source?tenant=acme")
        page.wait_for_selector("#continue textarea", timeout=20_000)
        page.click("#continue button")  # nothing typed: refused, and the page says why
        page.wait_for_function(
            "() => document.querySelector('#continue .action-result').textContent"
            ".startsWith('refused')", timeout=20_000,
        )  # fmt: skip
        refusal = page.text_content("#continue .action-result")
        page.fill("#follow-up", f"And in French? {HOSTILE}")
        page.click("#continue button")
        page.wait_for_url(lambda url: "/tasks/r-source" not in url, timeout=20_000)
        new_id = page.text_content("#request-id")
        page.wait_for_selector("#conversation[data-loaded='1']", timeout=20_000)
        shown = page.text_content("#conversation") or ""
        injected = page.evaluate("() => window.__xss")

    assert not offered_without_session
    assert refusal == "refused: prompt: the follow-up to send: a non-empty text", refusal
    assert new_id and new_id != "r-source"
    from agentq.store import TaskStore

    record = TaskStore(stack.dynamodb, stack.resources.table_name).require("acme", new_id)
    assert record.envelope is not None
    assert record.envelope.get("continues") == "r-source"
    assert record.envelope.get("prompt") == f"And in French? {HOSTILE}"
    assert "continues task r-source" in shown
    assert injected is None
