"""`agentq watch` as a person sees it, in a tmux pane: a hint when there is nothing to
show, tasks from `agentq submit` beside jobs, and the same exit code as `job status`."""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import AGENTQ, agentq, fresh_shell
from conftest import Stack
from support import wait_for

from agentq.config import Settings
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import SAMPLE_DEFINITIONS

pytestmark = pytest.mark.timeout(300)


class Pane:
    """One tmux pane on a private server (its own socket), running one command."""

    def __init__(self, env: dict[str, str], command: list[str]) -> None:
        self.socket = f"agentq-test-{uuid.uuid4().hex[:8]}"
        self._env = env
        self._tmux("new-session", "-d", "-s", "watch", "-x", "200", "-y", "50",
                   shlex.join(command))  # fmt: skip

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], env=self._env,
                              capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "watch")

    def wait_for_text(self, text: str, timeout: float = 60) -> str:
        return wait_for(lambda: (s := self.screen()) and text in s and s, timeout=timeout,
                        interval=0.2, message=f"{text!r} on the screen")  # fmt: skip

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self._env,
                       capture_output=True, check=False, timeout=30)  # fmt: skip


@pytest.fixture
def shell(stack: Stack) -> Iterator[dict[str, str]]:
    """A user's shell on a stack whose save-event and dispatcher Lambdas run (no worker)."""
    with LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                    serve_dlq=False):  # fmt: skip
        yield fresh_shell(**stack.env(), TASK_DEFINITIONS_DIR=str(SAMPLE_DEFINITIONS))


def test_watch_hints_when_empty_then_shows_a_submitted_task(shell: dict[str, str]) -> None:
    pane = Pane(shell, [AGENTQ, "watch", "--interval", "0.3"])
    try:
        empty = pane.wait_for_text("Submit one:")
        assert "No jobs, and no tasks" in empty and "tenant default" in empty
        submitted = agentq(shell, "submit", "sample-echo", "--input", '{"n": 1}', "--json")
        request_id = submitted.json()["requestId"]
        screen = pane.wait_for_text(request_id)
        assert "tasks submitted on their own" in screen and "PENDING" in screen
    finally:
        pane.close()
    recent = agentq(shell, "watch", "--once", "--json").json()
    assert [t["requestId"] for t in recent["tasks"]] == [request_id]
    assert recent["jobs"] == []


def test_watch_once_exits_like_job_status_for_a_failed_job(
    shell: dict[str, str], tmp_path: Path
) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"tasks": {"only": {"definition": "sample-echo"}}}))
    assert agentq(shell, "job", "create", str(spec), "--job-id", "gone").code == 0
    assert agentq(shell, "job", "cancel", "gone").code == 0
    assert agentq(shell, "job", "status", "gone").code == 4
    frame = agentq(shell, "watch", "gone", "--once", "--json")
    assert frame.code == 4 and frame.json()["state"] == "FAILED"
    drawn = agentq(shell, "watch", "gone", "--once")
    assert drawn.code == 4 and "cancelled by request" in drawn.stdout
    running = tmp_path / "running.json"
    running.write_text(json.dumps({"tasks": {"only": {"definition": "sample-echo"}}}))
    agentq(shell, "job", "create", str(running), "--job-id", "open")
    assert agentq(shell, "watch", "open", "--once", "--json").code == 0
