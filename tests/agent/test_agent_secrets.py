"""Planted secrets never reach events, logs, traces or error records."""

from __future__ import annotations

import json

import pytest
from agent_support import agent_definition, agent_rig
from conftest import Stack

from agentq.store.tasks import TaskStore

pytestmark = pytest.mark.timeout(240)

API_KEY = "sk-ant-api03-PLANTEDapiKEY0123456789abcdefghijkl"
AWS_KEY_ID = "AKIAIOSFODNN7PLANTED"
AWS_SECRET = "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"
SLACK_TOKEN = "xoxb-PLANTED-1234567890-abcdefghij"
GITHUB_TOKEN = "ghp_PLANTEDgithubTOKEN0123456789abcdefgh"
EMAIL = "planted.person@example.com"
ACCOUNT = "123456789012"
ARN = f"arn:aws:iam::{ACCOUNT}:role/PlantedRole"
SECRETS = (API_KEY, AWS_KEY_ID, AWS_SECRET, SLACK_TOKEN, GITHUB_TOKEN, EMAIL, ACCOUNT)


def test_agent_planted_secrets_reach_no_event_log_or_error_record(stack: Stack) -> None:
    # The fake model answers with an extra property named after the secrets; the CLI's
    # schema error quotes that name, so the secrets travel in a real error message.
    # (The CLI quotes the first ~100 characters of the name: the likeliest leaks go first.)
    leak = " ".join((GITHUB_TOKEN, AWS_KEY_ID, EMAIL, ARN, AWS_SECRET, SLACK_TOKEN))
    output = json.dumps({"title": "t", "points": ["p"], "score": 1, leak: 1})
    text = (
        f"Deploy notes. Ping {EMAIL}; the bot uses {SLACK_TOKEN} and CI uses {GITHUB_TOKEN}. "
        f"Role {ARN}. [[model: key leak; output {output}]]"
    )
    with agent_rig(
        stack, [agent_definition("note")], extra_env={"ANTHROPIC_API_KEY": API_KEY}
    ) as rig:
        task = rig.send("note", {"text": text})
        failed = rig.events.wait(task.request_id, "Task Failed")[0]
        worker_log = rig.worker.output()
        rig.worker.stop(timeout=30)
        worker_log = rig.worker.output()

    # The secrets did travel: the model saw the input, the error quoted the output.
    assert any(GITHUB_TOKEN in r.prompt for r in rig.model.requests("leak"))
    error = failed["payload"]["error"]
    assert error["category"] == "parse" and "REDACTED" in error["message"]

    record = TaskStore(stack.dynamodb, stack.resources.table_name).get("acme", task.request_id)
    assert record is not None
    places = {
        "events": "\n".join(rig.events.raw),
        "worker log": worker_log,
        # The STATE item keeps the envelope (the input, for recovery); its error must be clean.
        "state error": json.dumps(record.raw.get("error"), default=str),
        **{f"s3 {name}": body for name, body in rig.s3_files(task.request_id).items()},
    }
    assert "s3 error.json" in places and "s3 logs/summary.log" in places
    assert "s3 traces/session_trace.json" in places
    leaks = [(where, s) for where, body in places.items() for s in SECRETS if s in body]
    assert not leaks, leaks
