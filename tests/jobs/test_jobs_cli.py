"""The `agentq` CLI as scripts use it against the local stack, `--json` parsed, exit codes
checked (`watch` as a process, the rest in this process: tests/cli_support.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import agentq as run_agentq
from conftest import Stack
from jobs_support import drain, eventbridge, finish
from support import store_events

from agentq.cli._views import job_footer
from agentq.states import TaskState
from agentq.store.records import TaskRecord
from lambdas import dispatcher

pytestmark = pytest.mark.timeout(240)

DEFINITIONS_YAML = """\
- name: summarize
  kind: python
  description: Summarize one document
- name: write-report
  kind: agent
  timeout_s: 120
"""

JOB_YAML = """\
name: report
tasks:
  summarize:
    definition: summarize
    for_each: ["first", "second"]
    input: {document: "${item}"}
  report:
    definition: write-report
    input: {summaries: "${groups.summarize.results}"}
"""


def agentq(stack: Stack, *args: str, code: int = 0) -> Any:
    done = run_agentq({**os.environ, **stack.env(), "TENANT_ID": "acme"}, *args, timeout=90)
    assert done.code == code, done
    if "--json" in args and code == 0:
        return done.json()
    return done.stderr


def test_jobs_cli_definitions_and_single_tasks(stack: Stack, tmp_path: Path) -> None:
    defs = tmp_path / "defs.yaml"
    defs.write_text(DEFINITIONS_YAML)
    stored = agentq(stack, "definitions", "put", str(defs), "--json")
    assert [d["name"] for d in stored] == ["summarize", "write-report"]
    listed = agentq(stack, "definitions", "list", "--json")
    assert {d["name"]: d.get("timeout_s") for d in listed} == {
        "summarize": None,
        "write-report": 120,
    }

    args = ["submit", "summarize", "--input", '{"document": "x"}', "--idempotency-key", "doc-1"]
    first = agentq(stack, *args, "--json")
    again = agentq(stack, *args, "--json")
    assert first["requestId"] == again["requestId"] and first["tenant"] == "acme"
    sent = drain(stack)
    assert [m["requestId"] for m in sent] == [first["requestId"]]  # one message, not two
    assert sent[0]["input"] == {"document": "x"}
    # The same key with other input returns that task too, and says so on stderr.
    env = {**os.environ, **stack.env(), "TENANT_ID": "acme"}
    same = run_agentq(env, *args)
    assert (same.code, same.stdout.strip(), same.stderr) == (0, first["requestId"], "")
    differs = run_agentq(env, "submit", "summarize", "--input", '{"document": "y"}',
                         "--idempotency-key", "doc-1")  # fmt: skip
    assert (differs.code, differs.stdout.strip()) == (0, first["requestId"])
    assert "exists already, with another definition or input" in differs.stderr
    assert drain(stack) == []  # still one message

    status = agentq(stack, "status", first["requestId"], "--json")
    assert (status["state"], status["definition"]) == ("PENDING", "summarize")
    store_events(stack)
    timeline = agentq(stack, "events", first["requestId"], "--json")
    assert [e["detailType"] for e in timeline] == ["Task Pending"]

    unknown = agentq(stack, "submit", "nope", "--json", code=6)
    assert "unknown task definition" in unknown and "agentq definitions list" in unknown
    assert "not found" in agentq(stack, "status", "no-such-task", "--json", code=3)
    cancelled = agentq(stack, "cancel", first["requestId"], "--json")
    assert (cancelled["outcome"], cancelled["task"]["state"]) == ("cancelled", "CANCELLED")
    assert "already CANCELLED" in agentq(stack, "cancel", first["requestId"], code=6)
    later = agentq(stack, "submit", "summarize", "--input", '{"document": "y"}', "--delay", "600",
                   "--json")  # fmt: skip
    assert later["state"] == "SCHEDULED" and later["notBefore"]
    assert drain(stack) == []  # SQS holds the message back (DelaySeconds)
    err = agentq(stack, "submit", "summarize", "--delay", "5", "--not-before", "2030-01-01T00:00Z",
                 code=2)  # fmt: skip
    assert "not allowed with" in err
    assert "ISO 8601" in agentq(stack, "submit", "summarize", "--not-before", "soon", code=6)
    err = agentq(stack, "submit", "write-report", "--wait", "--timeout", "1", code=7)
    assert "still PENDING" in err
    assert agentq(stack, "definitions", "delete", "summarize", "--json") == {"deleted": "summarize"}


@pytest.mark.process  # `agentq watch` runs as the installed command
def test_jobs_cli_job_lifecycle(stack: Stack, tmp_path: Path) -> None:
    defs = tmp_path / "defs.yaml"
    defs.write_text(DEFINITIONS_YAML)
    agentq(stack, "definitions", "put", str(defs))
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB_YAML)
    bad = tmp_path / "cycle.yaml"
    bad.write_text(
        "tasks:\n  a: {definition: summarize, depends_on: [b]}\n"
        "  b: {definition: summarize, depends_on: [a]}\n"
    )
    assert "cycle: a → b → a" in agentq(stack, "job", "create", str(bad), "--json", code=6)
    assert agentq(stack, "job", "list", "--json") == []  # nothing was created

    created = agentq(stack, "job", "create", str(spec), "--job-id", "cli-job", "--json")
    assert (created["jobId"], created["total"], created["state"]) == ("cli-job", 3, "RUNNING")
    status = agentq(stack, "job", "status", "cli-job", "--json")
    states = {t["key"]: t["state"] for t in status["tasks"]}
    assert states == {"summarize_0": "PENDING", "summarize_1": "PENDING", "report": "BLOCKED"}

    for key in ("summarize_0", "summarize_1", "report"):
        dispatcher.handler(eventbridge(finish(stack, "cli-job", key, tenant="acme")), None)
    frame = agentq(stack, "watch", "cli-job", "--json")
    assert (frame["state"], frame["done"], frame["completed"]) == ("COMPLETED", 3, 3)
    agentq(stack, "watch", "cli-job", "--interval", "0.1")  # live view; ends as the job closed
    # The table names tasks by key; the line under it says what `agentq result` takes.
    shown = run_agentq({**os.environ, **stack.env(), "TENANT_ID": "acme", "COLUMNS": "200"},
                       "job", "status", "cli-job")  # fmt: skip
    assert "`agentq result cli-job-summarize_0`" in shown.stdout, shown

    agentq(stack, "job", "create", str(spec), "--job-id", "doomed")
    cancelled = agentq(stack, "job", "cancel", "doomed", "--json")
    assert len(cancelled["cancelled"]) == 3 and cancelled["job"]["state"] == "FAILED"
    agentq(stack, "job", "status", "doomed", code=4)


def _record(request_id: str, state: TaskState) -> TaskRecord:
    return TaskRecord(request_id=request_id, tenant="acme", state=state, attempt=1,
                      definition="d", job_id="j", owner=None, lease_token=None,
                      effective_until_ms=None, created_at_ms=None, updated_at_ms=None,
                      raw={})  # fmt: skip


def test_job_status_footer_sends_a_failed_task_to_status_not_result() -> None:
    done, failed = _record("j-a", TaskState.COMPLETED), _record("j-b", TaskState.FAILED)
    footer = job_footer("j", {"a": done, "b": failed})
    assert footer is not None and "`agentq status j-b`" in footer and "result" not in footer
    assert "`agentq result j-a`" in (job_footer("j", {"b": None, "a": done}) or "")
    assert job_footer("j", {"a": None}) is None
