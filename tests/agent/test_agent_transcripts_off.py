"""A tenant that does not store transcripts: its resumable agent task keeps no checkpoint,
starts over after a kill, and cannot be continued.

Real workers, the bundled CLI, the offline model server, the real `agentq` command: the
operator turns transcripts off for the tenant; its task (resume: true) is killed with
its worker at turn 2 and the retry on a second worker runs the conversation from its
first turn. No checkpoint object exists in S3 at any point, and `--continue` is refused.
"""

from __future__ import annotations

import json

import pytest
from agent_support import agent_definition, agent_rig
from cli_support import agentq
from conftest import Stack
from support import wait_for

from agentq.store.keys import task_prefix
from agentq.store.tasks import TaskStore
from agentq.store.tenants import TenantLimitStore

pytestmark = pytest.mark.timeout(240)

KILLED_AT = 2


def _checkpoints(stack: Stack, request_id: str) -> list[str]:
    listing = stack.s3.list_objects_v2(Bucket=stack.resources.bucket,
                                       Prefix=task_prefix("acme", request_id))  # fmt: skip
    return [o["Key"] for o in listing.get("Contents", []) if "/checkpoint/" in o["Key"]]


def test_a_tenant_without_transcripts_keeps_no_checkpoint_and_is_not_resumed(
    stack: Stack,
) -> None:
    TenantLimitStore(stack.dynamodb, stack.resources.table_name).set_transcripts(
        "acme", stored=False
    )
    definition = agent_definition(
        "long", max_attempts=3,
        settings={"resume": True, "allowed_tools": ["Bash"], "max_turns": 12,
                  "retry_attempts": 1},
    )  # fmt: skip
    tools = "; ".join(f'tool Bash {{"command": "echo step-{n}"}}' for n in range(1, 4))
    script = f"[[model: key hush; {tools}; stall x1 turn {KILLED_AT}]]"
    with agent_rig(stack, [definition], AGENT_CHECKPOINT_INTERVAL="100") as rig:
        task = rig.send("long", {"text": f"Work through the steps. {script}"})
        wait_for(lambda: (r := rig.model.requests("hush")) and r[-1].outcome == "stall",
                 timeout=120, message="attempt 1 waiting on its model at turn 2")  # fmt: skip
        during = _checkpoints(stack, task.request_id)
        rig.worker.kill()
        rig.another_worker("agent-worker-2")
        completed = rig.events.wait(task.request_id, "Task Completed", timeout=180)[0]
        requests = rig.model.requests("hush")
        after = _checkpoints(stack, task.request_id)
        record = TaskStore(stack.dynamodb, stack.resources.table_name).require(
            "acme", task.request_id
        )
        refused = agentq(rig.env, "submit", "long", "--continue", task.request_id,
                         "--prompt", "And?", "--tenant", "acme", "--json")  # fmt: skip
        summary = rig.s3_text(rig.prefix(task.request_id) + "logs/summary.log")

    assert during == [] and after == []  # nothing of the conversation reached S3
    stalled = [r.index for r in requests if r.outcome == "stall"]
    assert len(stalled) == 1
    retry = [r for r in requests if r.index > stalled[0]]
    assert retry[0].turn == 0  # attempt 2 started the conversation over
    assert completed["attempt"] == 2
    assert completed["payload"]["resume"]["status"] == "off"
    assert "does not store transcripts" in completed["payload"]["resume"]["reason"]
    assert "no checkpoint: tenant acme does not store transcripts" in summary
    assert record.raw.get("transcripts") == "off" and "checkpoint" not in record.raw
    assert refused.code == 6, refused
    error = json.loads(refused.stdout or refused.stderr)["error"]
    assert "tenant acme does not store transcripts" in error["message"]
