"""A resumable agent task killed mid-conversation goes on from its checkpoint on another worker.

Real workers, the bundled CLI, the offline model server: the first worker is SIGKILLed
(with its task child, like a host that died) once the checkpoint of turn 3 is in S3;
a second worker takes the retry, restores that checkpoint and finishes the conversation
without running its first three turns again. Two CLI runs in all.
"""

from __future__ import annotations

import itertools
import json

import pytest
from agent_support import agent_definition, agent_rig
from conftest import Stack
from support import wait_for

from agentq.checkpoints import Part, decode, decode_part, read_attempt
from agentq.client import AgentqClient
from agentq.store.keys import attempt_prefix
from agentq.store.tasks import TaskStore
from worker.settle.checkpoints import checkpoint_key

pytestmark = pytest.mark.timeout(240)

STEPS = 5
KILLED_AT = 3  # the turn attempt 1 stalls at, its first three done and checkpointed


def _bash_steps(count: int) -> str:
    """Model directives: a Bash call a turn, `echo step-1` to `echo step-{count}`."""
    return "; ".join(f'tool Bash {{"command": "echo step-{n}"}}' for n in range(1, count + 1))


def _checkpoint_turns(stack: Stack, request_id: str, attempt: int) -> int:
    """Turns in the attempt's checkpoint as a retry reads it (-1: none yet)."""
    found = read_attempt(stack.s3, stack.resources.bucket, "acme", request_id, attempt)
    return -1 if found is None else decode(found.data).turns


def _parts(stack: Stack, request_id: str, attempt: int) -> list[Part]:
    folder = attempt_prefix("acme", request_id, attempt) + "checkpoint/part-"
    listed = stack.s3.list_objects_v2(Bucket=stack.resources.bucket, Prefix=folder)
    keys = sorted(obj["Key"] for obj in listed.get("Contents", []))
    return [decode_part(stack.s3.get_object(Bucket=stack.resources.bucket, Key=key)["Body"]
                        .read()) for key in keys]  # fmt: skip


def test_a_task_killed_at_a_turn_resumes_from_its_checkpoint_on_another_worker(
    stack: Stack,
) -> None:
    definition = agent_definition(
        "long",
        max_attempts=3,
        settings={"resume": True, "allowed_tools": ["Bash"], "max_turns": 12,
                  "retry_attempts": 1},
    )  # fmt: skip
    tools = _bash_steps(STEPS)
    # Each answer takes 0.7 s, many upload passes: each turn's entries go up as a part of
    # their own even where the worker's uploader thread waits for a loaded CPU.
    script = f"[[model: key resume; {tools}; stall x1 turn {KILLED_AT}; delay 700ms]]"
    with agent_rig(stack, [definition], AGENT_CHECKPOINT_INTERVAL="100") as rig:
        task = rig.send("long", {"text": f"Work through the steps. {script}"})
        wait_for(
            lambda: _checkpoint_turns(stack, task.request_id, 1) == KILLED_AT,
            timeout=120,
            message=f"the checkpoint of turn {KILLED_AT} in S3",
        )
        wait_for(lambda: rig.model.requests("resume")[-1].outcome == "stall",
                 timeout=60, message="attempt 1 waiting on its model")  # fmt: skip
        rig.worker.kill()
        rig.another_worker("agent-worker-2")
        completed = rig.events.wait(task.request_id, "Task Completed", timeout=180)[0]
        requests = rig.model.requests("resume")
        second_checkpoint = _checkpoint_turns(stack, task.request_id, 2)
        first_parts = _parts(stack, task.request_id, 1)
        killed_whole = stack.s3.list_objects_v2(
            Bucket=stack.resources.bucket, Prefix=checkpoint_key("acme", task.request_id, 1)
        )
        conversation = AgentqClient.from_env().conversation(task.request_id, tenant="acme")

    # Attempt 1 answered three turns and stalled on the fourth; attempt 2's first request
    # carried those three turns, and the conversation went on from the fourth step.
    stalled = [r.index for r in requests if r.outcome == "stall"]
    assert len(stalled) == 1
    before = [r for r in requests if r.index < stalled[0]]
    after = [r for r in requests if r.index > stalled[0]]
    assert [r.outcome for r in before] == ["tool_use:Bash"] * KILLED_AT
    assert after[0].turn == KILLED_AT
    assert [r.outcome for r in after] == ["tool_use:Bash"] * (STEPS - KILLED_AT) + [
        "tool_use:StructuredOutput"
    ]
    fresh_start_turns = STEPS + 1
    assert len(after) < fresh_start_turns

    # Attempt 1 uploaded each turn's new entries only, as parts that follow one another;
    # killed, it never put a whole checkpoint, and attempt 2 resumed from the parts.
    assert len(first_parts) >= 2 and first_parts[0].first_entry == 0
    for before_part, part in itertools.pairwise(first_parts):
        assert part.first_entry == before_part.first_entry + len(before_part.lines) > 0
    assert first_parts[-1].turns == KILLED_AT
    assert killed_whole.get("KeyCount") == 0

    # The winner is attempt 2: its result, its checkpoint, and it says where it resumed.
    assert completed["attempt"] == 2
    assert completed["payload"]["resume"] == {
        "status": "resumed",
        "from_attempt": 1,
        "turns": KILLED_AT,
    }
    winner = attempt_prefix("acme", task.request_id, 2)
    assert completed["payload"]["result"]["key"].startswith(winner)
    record = TaskStore(stack.dynamodb, stack.resources.table_name).require("acme", task.request_id)
    assert record.raw["artifacts"]["prefix"] == winner
    assert second_checkpoint == fresh_start_turns  # every step and the structured answer
    summary = rig.s3_text(winner + "logs/summary.log")
    assert f"resuming the session of attempt 1 from its checkpoint ({KILLED_AT} turns)" in summary
    trace = json.loads(rig.s3_text(winner + "traces/session_trace.json"))
    assert trace["resume"]["from_attempt"] == 1

    # The producer client reads the conversation across both attempts: each turn once,
    # the resume where attempt 2 began, every tool call with its input and output.
    assert [(a.attempt, a.resumed) for a in conversation.attempts] == [(1, False), (2, True)]
    kinds = [(t.attempt, t.kind) for t in conversation.turns]
    assert kinds[0] == (1, "prompt") and kinds.count((2, "resume")) == 1
    calls = [b.text for t in conversation.turns for b in t.blocks if b.tool == "Bash"
             and b.kind == "tool_call"]  # fmt: skip
    assert [json.loads(c)["command"] for c in calls] == [f"echo step-{n}" for n in range(1, 6)]
    results = [b.text for t in conversation.turns for b in t.blocks if b.kind == "tool_result"]
    assert results[:STEPS] == [f"step-{n}" for n in range(1, STEPS + 1)]
    assert {t.attempt for t in conversation.turns if t.kind == "assistant"} == {1, 2}


def test_a_step_deadline_and_a_drain_each_end_an_attempt_that_the_next_resumes(
    stack: Stack,
) -> None:
    # "slow" runs out its step deadline stalled at turn 2 (one try an attempt): attempt 2
    # resumes. "long" is stalled at turn 2 when its worker drains: the drain stops and
    # releases it, and attempt 2 resumes on another worker. Each from turn 2, not turn 0.
    common = {"resume": True, "allowed_tools": ["Bash"], "max_turns": 12, "retry_attempts": 1}
    definitions = [
        agent_definition("slow", max_attempts=3, settings={**common, "step_timeout_s": 20}),
        agent_definition("long", max_attempts=3, settings=common),
    ]
    tools = _bash_steps(3)
    with agent_rig(stack, definitions, AGENT_CHECKPOINT_INTERVAL="100",
                   DRAIN_TIMEOUT="1000") as rig:  # fmt: skip
        slow = rig.send("slow", {"text": f"Steps. [[model: key slow; {tools}; stall x1 turn 2]]"})
        long = rig.send("long", {"text": f"Steps. [[model: key long; {tools}; stall x1 turn 2]]"})
        slow_done = rig.events.wait(slow.request_id, "Task Completed", timeout=180)[0]
        wait_for(lambda: _checkpoint_turns(stack, long.request_id, 1) == 2
                 and rig.model.requests("long")[-1].outcome == "stall",
                 timeout=60, message="long checkpointed at turn 2, waiting on its model")  # fmt: skip
        rig.worker.stop(timeout=60)  # a drain: the stalled task is stopped and released
        rig.another_worker("agent-worker-2")
        long_done = rig.events.wait(long.request_id, "Task Completed", timeout=180)[0]
        ended = {t.request_id: rig.events.of(t.request_id, "Task Processing Failed")
                 for t in (slow, long)}  # fmt: skip
        requests = {key: rig.model.requests(key) for key in ("slow", "long")}

    for key, done in (("slow", slow_done), ("long", long_done)):
        stall = next(r.index for r in requests[key] if r.outcome == "stall")
        after = [r for r in requests[key] if r.index > stall]
        assert after[0].turn == 2, key  # a fresh start would ask at turn 0
        assert done["attempt"] == 2
        assert done["payload"]["resume"] == {"status": "resumed", "from_attempt": 1, "turns": 2}
    (timed_out,) = ended[slow.request_id]
    assert timed_out["payload"]["error"]["category"] == "timeout"
    (released,) = ended[long.request_id]
    assert released["payload"]["error"]["exception_type"] == "WorkerShutdown"


def test_a_throttled_model_call_resumes_the_session_inside_the_attempt(stack: Stack) -> None:
    # Two tries in the child: the 429 at turn 3 ends the first; the second goes on from
    # the checkpoint of turn 3 instead of asking for the first three turns again.
    definition = agent_definition(
        "long",
        settings={"resume": True, "allowed_tools": ["Bash"], "max_turns": 12,
                  "retry_attempts": 2},
    )  # fmt: skip
    tools = _bash_steps(STEPS)
    script = f"[[model: key throttled; {tools}; fail 429 x1 turn {KILLED_AT}]]"
    with agent_rig(stack, [definition], AGENT_CHECKPOINT_INTERVAL="100") as rig:
        task = rig.send("long", {"text": f"Work through the steps. {script}"})
        completed = rig.events.wait(task.request_id, "Task Completed")[0]
        requests = rig.model.requests("throttled")
        prefix = attempt_prefix("acme", task.request_id, completed["attempt"])
        summary = rig.s3_text(prefix + "logs/summary.log")
        trace = json.loads(rig.s3_text(prefix + "traces/session_trace.json"))

    throttled = [r.index for r in requests if r.status == 429]
    assert len(throttled) == 1
    before = [r for r in requests if r.index < throttled[0]]
    after = [r for r in requests if r.index > throttled[0]]
    assert [r.outcome for r in before] == ["tool_use:Bash"] * KILLED_AT
    assert after[0].turn == KILLED_AT  # a fresh start would ask at turn 0
    assert [r.outcome for r in after] == ["tool_use:Bash"] * (STEPS - KILLED_AT) + [
        "tool_use:StructuredOutput"
    ]
    assert completed["attempt"] == 1  # the child's own retry, not the worker's
    assert f"try 2 resumes the session from its checkpoint ({KILLED_AT} turns)" in summary
    assert [a["outcome"] for a in trace["attempts"]] == ["rate_limit", "success"]


def test_a_corrupt_checkpoint_starts_the_session_afresh_and_says_so(stack: Stack) -> None:
    definition = agent_definition("long", settings={"resume": True, "allowed_tools": ["Bash"]})
    with agent_rig(stack, [definition], AGENT_CHECKPOINT_INTERVAL="100") as rig:
        request_id = "ag-corrupt-checkpoint"
        # What a crash in the middle of a (non-atomic) copy would leave: a cut transcript.
        cut = b'{"agentq_checkpoint": 1, "session_id": "6c1f5bd0-0000-4000-8000-00000000000'
        stack.s3.put_object(Bucket=stack.resources.bucket,
                            Key=checkpoint_key("acme", request_id, 1), Body=cut)  # fmt: skip
        task = rig.send(
            "long",
            {"text": 'Go. [[model: key fresh; tool Bash {"command": "echo one"}]]'},
            request_id=request_id,
        )
        completed = rig.events.wait(task.request_id, "Task Completed")[0]
        requests = rig.model.requests("fresh")

    resume = completed["payload"]["resume"]
    assert resume["status"] == "fresh"
    assert resume["reason"].startswith("checkpoint of attempt 1 is corrupt")
    assert requests[0].turn == 0  # the conversation began at its first turn
    assert [r.outcome for r in requests] == ["tool_use:Bash", "tool_use:StructuredOutput"]
    # The winner is attempt 1 unless a loaded host cost it its lease before its CLI asked
    # anything; either way it found attempt 1's checkpoint cut and began afresh.
    winner = completed["attempt"]
    summary = rig.s3_text(attempt_prefix("acme", task.request_id, winner) + "logs/summary.log")
    assert "starting afresh: checkpoint of attempt 1 is corrupt" in summary
    # The winner's own, good checkpoint (attempt 1's replaced the cut one).
    assert _checkpoint_turns(stack, task.request_id, winner) == 2
