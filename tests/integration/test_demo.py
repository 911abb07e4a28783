"""`make demo` end to end, as a newcomer runs it: the job ends as designed, nothing is left."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
# A row of the demo's check table: task, expected, got, attempts, ok.
_ROW = re.compile(r"│ (\S+)\s+│ [^│]+│ (\S+)\s+│ (\d+)\s+│ (\S+)\s+│")


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("AGENTQ_DEMO_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_make_demo_runs_the_job_as_designed_and_leaves_no_process() -> None:
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    # Offline unless asked (DEMO_REAL_CLAUDE=1), even with a key in the shell.
    for name in ("CLAUDE_CODE_OAUTH_TOKEN", "AWS_ENDPOINT_URL", "DEMO_REAL_CLAUDE"):
        env.pop(name, None)
    env["ANTHROPIC_API_KEY"] = "sk-ant-not-a-real-key"
    env["COLUMNS"] = "160"  # one table row per line
    env["AGENTQ_DEMO_MARKER"] = marker  # inherited by every process the demo starts
    completed = subprocess.run(
        ["make", "--no-print-directory", "demo", "DEMO_ARGS=--plain"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    assert "offline model server" in output
    assert "web console (read-only): http://127.0.0.1:" in output
    assert "it lives as long as the demo" in output
    assert "did the job end as designed?" in output
    checks = output.split("did the job end as designed?")[1]
    rows = {m.group(1): m.groups()[1:] for m in _ROW.finditer(checks)}
    assert rows["flaky"] == ("COMPLETED", "2", "yes"), rows
    assert rows["report"] == ("COMPLETED", "1", "yes"), rows
    assert rows["deadline"] == ("TIMEOUT", "1", "yes"), rows
    assert rows["resumable"] == ("COMPLETED", "2", "yes"), rows
    summaries = [key for key in rows if key.startswith("summarize_")]
    assert len(summaries) >= 3 and all(rows[k][0] == "COMPLETED" for k in summaries), rows
    # The retried task's timeline shows the failed attempt and the completed retry.
    assert "Task Processing Failed" in output and "Task Completed" in output
    assert "all stopped cleanly" in output
    # The resumable task was killed at its scripted stall (two turns done and checkpointed)
    # and its records say the retry went on from there: the failed attempt's event, the
    # winner's resume record and the resume marker in its conversation.
    resumed = [line.split("resumed task: ", 1)[1] for line in output.splitlines()
               if "resumed task: " in line]  # fmt: skip
    assert "the demo SIGKILLed its process group" in output
    assert resumed[0] == "attempt 1 ended: child killed by SIGKILL (out of memory?)", resumed
    assert resumed[1] == (
        "attempt 2 resumed from the checkpoint of attempt 1 (2 turns done) and completed"
    ), resumed
    assert re.fullmatch(
        r"its conversation \(\d+ turns\) marks the resume at turn \d+, where attempt 2 began",
        resumed[2],
    ), resumed
    # A job that failed by design says so, rather than a bare FAILED after all-yes checks.
    assert "as designed: deadline timed out on purpose" in output
    assert _marked(marker) == [], "the demo left processes running"
