"""The demo's resumed task: killed mid-conversation, and what its own records say after.

`ResumeKill` watches the demo's resumable `checklist` task and, once its model is
waiting on a scripted stall and its checkpoint in S3 shows the turns before it,
SIGKILLs the task's child process group (the child and the Claude CLI it started), as
the OOM killer or a dying host would; the worker's retry goes on from that checkpoint.
`resume_lines` tells the story from the task's records: the failed attempt's event, the
winning attempt's resume record and the conversation's resume marker, never from what
the demo meant to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from agentq.security import sanitize_error_message

RESUME_KEY: Final = "demo-resume"
# The model stalls on turn KILL_TURN of attempt 1 (that many turns done): the kill lands there.
KILL_TURN: Final = 2
STEPS: Final = 4
CHECKLIST: Final = "\n".join(f"{n}. print step {n}" for n in range(1, STEPS + 1))
RESUME_MARKER: Final = (
    f"[[model: key {RESUME_KEY}; "
    + "; ".join(f'tool Bash {{"command": "echo step-{n}"}}' for n in range(1, STEPS + 1))
    + f"; stall x1 turn {KILL_TURN}]]"
)


class ResumeKill:
    """Kills the task once (`poll` on each tick of the demo's progress loop)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.killed_pids: list[int] = []
        self.problem: str | None = None

    def poll(self, client: Any, model_server: Any, workers: Iterable[Any]) -> None:
        if self.killed_pids or model_server is None:
            return
        stalled = any(r.outcome == "stall" for r in model_server.requests(RESUME_KEY))
        if not stalled or self._checkpointed_turns(client) < KILL_TURN:
            return
        self.killed_pids = [pid for w in workers for pid in w.kill_task(self.request_id)]
        if not self.killed_pids:
            self.problem = "its process was not found"

    def _checkpointed_turns(self, client: Any) -> int:
        """Assistant turns attempt 1's checkpoint in S3 holds (0 while there is none)."""
        try:
            conversation = client.conversation(self.request_id)
        except Exception:  # not stored yet, S3 slow: the next tick asks again
            return 0
        return sum(1 for t in conversation.turns if t.attempt == 1 and t.kind == "assistant")


def resume_lines(client: Any, request_id: str) -> list[str]:
    """What happened to the resumable task, from its events and its conversation."""
    events = client.events(request_id)
    failed = [e for e in events if e.get("detailType") == "Task Processing Failed"]
    ends = [e for e in events if e.get("detailType") == "Task Completed"]
    lines = []
    for event in failed:
        error = (event.get("payload") or {}).get("error") or {}
        message = sanitize_error_message(str(error.get("message", "?")))
        lines.append(f"attempt {event.get('attempt')} ended: {message}")
    if not ends:
        return [*lines, "it did not complete"]
    end = ends[-1]
    resume = (end.get("payload") or {}).get("resume") or {}
    if resume.get("status") == "resumed":
        lines.append(
            f"attempt {end.get('attempt')} resumed from the checkpoint of attempt "
            f"{resume.get('from_attempt')} ({resume.get('turns')} turns done) and completed"
        )
    else:
        why = resume.get("reason") or "no resume record"
        lines.append(f"attempt {end.get('attempt')} completed without resuming ({why})")
    conversation = client.conversation(request_id)
    marks = [t for t in conversation.turns if t.kind == "resume"]
    if marks:
        lines.append(
            f"its conversation ({conversation.total_turns} turns) marks the resume at turn "
            f"{marks[0].index + 1}, where attempt {marks[0].attempt} began"
        )
    else:
        lines.append("its conversation shows no resume")
    return lines
