"""`agentq submit --resume / --no-resume`, the real command against moto's server: the
task's own resume goes into its envelope and `agentq status` shows it; one for a
definition that is not an agent's is refused in one line."""

from __future__ import annotations

import json

from cli_support import agentq, fresh_shell, one_line_error
from conftest import Stack

from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.store import TaskStore

AGENT = {"prompt": "Note {text}", "output_schema": {"type": "object"}}


def test_submit_sets_or_leaves_the_tasks_own_resume(stack: Stack) -> None:
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    table.put(TaskDefinition(name="notes", kind="agent", settings=AGENT))
    table.put(TaskDefinition(name="noop", kind="python"))
    shell = fresh_shell(**stack.env())
    store = TaskStore(stack.dynamodb, stack.resources.table_name)
    given = {"--resume": True, "--no-resume": False, None: None}
    for flag, resume in given.items():
        args = ["submit", "notes", "--input", '{"text": "x"}', "--json"]
        ran = agentq(shell, *args, *([flag] if flag else []))
        assert ran.code == 0, ran
        request_id, tenant = ran.json()["requestId"], ran.json()["tenant"]
        assert ran.json()["resume"] is resume
        envelope = store.require(tenant, request_id).envelope or {}
        assert envelope.get("resume") is resume
        status = agentq(shell, "status", request_id, "--json")
        assert status.json()["resume"] is resume, status
    shown = agentq(shell, "status", request_id)  # the last: no flag, no row
    assert "resume" not in shown.stdout
    ran = agentq(shell, "submit", "notes", "--input", '{"text": "x"}', "--no-resume")
    shown = agentq(shell, "status", ran.stdout.strip())
    rows = [line.split(None, 1) for line in shown.stdout.splitlines() if line.strip()]
    assert ["resume", "off for this task (over its definition's)"] in [
        [name, value.strip()] for name, value in rows
    ], shown

    ran = agentq(shell, "submit", "noop", "--resume")
    assert ran.code == 6, ran
    assert "resume: 'noop' is a python definition" in one_line_error(ran)
    listing = stack.sqs.receive_message(QueueUrl=stack.resources.queue_url,
                                        MaxNumberOfMessages=10)  # fmt: skip
    assert all(json.loads(m["Body"])["definition"] == "notes" for m in listing["Messages"])
