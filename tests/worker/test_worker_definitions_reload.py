"""A definition saved while a worker runs is run by it, with no restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Stack
from support import EventLog, wait_for
from worker_support import running_worker

from agentq.client import AgentqClient

pytestmark = pytest.mark.timeout(120)


def test_a_worker_runs_a_definition_saved_after_it_started(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "first.yaml").write_text(
        "name: first\nkind: python\nsettings: {callable: 'agentq.samples:echo'}\n"
    )
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(tmp_path))
    events = EventLog(stack)
    with running_worker(stack, TASK_DEFINITIONS_DIR=str(tmp_path)):
        first = AgentqClient.from_env().submit("first", {"n": 1})
        events.wait(first.request_id, "Task Completed")  # the worker is up and reading
        (tmp_path / "added.yaml").write_text(
            "name: added\nkind: python\nsettings: {callable: 'agentq.samples:echo'}\n"
        )
        added = AgentqClient.from_env().submit("added", {"n": 2})
        ended = wait_for(
            lambda: [t for t in events.types(added.request_id)
                     if t in ("Task Completed", "Task Failed")],
            timeout=60, message="the added task ended",
        )  # fmt: skip
    assert ended == ["Task Completed"], events.of(added.request_id)
