"""`agentq trace ID --conversation`: an agent task's turns across its attempts, through the
real CLI against the stage's table and bucket, hostile text drawn harmless, and each
reason there is nothing to show said plainly.

The checkpoints are the real CLI's (tests/unit/fixtures: a task killed after two turns
and resumed by attempt 2), placed where the worker puts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Stack

from agentq.cli import main as cli
from agentq.cli.common import EXIT_OK
from agentq.store.codec import to_item
from agentq.store.keys import STATE_SK, checkpoint_key, task_pk
from agentq.store.tenants import TenantLimitStore

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures"
HOSTILE = "[bold red]forged[/bold red] \x1b]0;owned\x07\x1b[2J"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli(list(argv))
    return code, capsys.readouterr().out


def _task(stack: Stack, request_id: str, *, definition: str, attempt: int,
          state: str = "COMPLETED", tenant: str = "acme") -> None:  # fmt: skip
    item = {"PK": task_pk(tenant, request_id), "SK": STATE_SK, "requestId": request_id,
            "tenant": tenant, "state": state, "attempt": attempt, "definition": definition,
            "envelope": {"requestId": request_id, "tenant": tenant, "definition": definition}}  # fmt: skip
    stack.dynamodb.put_item(TableName=stack.resources.table_name, Item=to_item(item))


def _checkpoint(stack: Stack, request_id: str, attempt: int, data: bytes) -> None:
    stack.s3.put_object(Bucket=stack.resources.bucket,
                        Key=checkpoint_key("acme", request_id, attempt), Body=data)  # fmt: skip


@pytest.fixture
def definitions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def agent(name: str, resume: bool) -> dict[str, Any]:
        return {"name": name, "kind": "agent", "settings": {
            "prompt": "{text}", "resume": resume,
            "output_schema": {"type": "object", "properties": {}}}}  # fmt: skip

    (tmp_path / "defs.yaml").write_text(
        yaml.safe_dump([agent("chat", True), agent("plain", False)])
    )
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(tmp_path))


def test_a_resumed_tasks_conversation_shows_both_attempts_and_where_it_resumed(
    stack: Stack, capsys: pytest.CaptureFixture[str], definitions: None
) -> None:
    _task(stack, "r-resumed", definition="chat", attempt=2)
    _checkpoint(stack, "r-resumed", 1, (FIXTURES / "resumed-attempt-1.jsonl").read_bytes())
    hostile = {"type": "assistant", "uuid": "hostile-1", "message": {
        "role": "assistant", "content": [{"type": "text", "text": HOSTILE}]}}  # fmt: skip
    second = (FIXTURES / "resumed-attempt-2.jsonl").read_bytes() + json.dumps(hostile).encode()
    _checkpoint(stack, "r-resumed", 2, second)

    code, drawn = _run(capsys, "trace", "r-resumed", "--conversation", "--tenant", "acme")
    assert code == EXIT_OK
    assert "attempt 1" in drawn and "attempt 2 · resumed from an earlier attempt" in drawn
    assert drawn.index("attempt 1") < drawn.index("↻ resumed here") < drawn.rindex("→ Bash")
    assert "Work through the steps <img src=x onerror=alert(1)>." in drawn
    assert "Bash" in drawn and "echo step-1" in drawn and "step-2" in drawn
    # The model's markup is shown as written, and no control character reaches the terminal.
    assert "[bold red]forged[/bold red]" in drawn
    assert "\x1b" not in drawn and "\x07" not in drawn

    code, shown = _run(capsys, "trace", "r-resumed", "--conversation", "--tenant", "acme",
                       "--json")  # fmt: skip
    data = json.loads(shown)
    assert [(a["attempt"], a["resumed"]) for a in data["attempts"]] == [(1, False), (2, True)]
    assert [t["kind"] for t in data["turns"]].count("resume") == 1


def test_each_reason_for_no_conversation_is_said(
    stack: Stack, capsys: pytest.CaptureFixture[str], definitions: None
) -> None:
    _task(stack, "r-plain", definition="plain", attempt=1)
    code, drawn = _run(capsys, "trace", "r-plain", "--conversation", "--tenant", "acme")
    assert code == EXIT_OK and "no conversation stored (resume off for this definition)" in drawn
    _task(stack, "r-running", definition="chat", attempt=1, state="PROCESSING")
    assert "no checkpoint yet" in _run(capsys, "trace", "r-running", "--conversation",
                                       "--tenant", "acme")[1]  # fmt: skip
    # The tenant opted out: nothing is read, even a checkpoint stored before.
    _task(stack, "r-hush", definition="chat", attempt=1, tenant="hush")
    stack.s3.put_object(Bucket=stack.resources.bucket, Key=checkpoint_key("hush", "r-hush", 1),
                        Body=(FIXTURES / "resumed-attempt-1.jsonl").read_bytes())  # fmt: skip
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set_transcripts(
        "hush", stored=False
    )
    code, drawn = _run(capsys, "trace", "r-hush", "--conversation", "--tenant", "hush")
    assert "no conversation stored (tenant hush does not store transcripts)" in drawn
    assert "echo step-1" not in drawn
