"""docs/tutorial.md, executed: every block in order, as one shell session on the local stack.

Conventions of the page (an HTML comment on the line before a block):
- `<!-- file: PATH -->`: the block's text is written to PATH (the reader's editor);
- `<!-- background: PATH -->`: the command runs in the background (the reader's second
  terminal) until the end, and the next block waits for PATH to appear;
- `<!-- deploy-only -->` and `<!-- tutorial-skip: why -->`: not run here; each shows as
  a skipped test, so what is not covered stays visible.
Other `bash` blocks run with `bash -euo pipefail`, keeping the directory and exported
variables from one block to the next as a terminal would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import wait_for

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
_BLOCK = re.compile(r"(?:<!--\s*(?P<marker>[^>]*?)\s*-->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```",
                    re.DOTALL)  # fmt: skip


@dataclass(frozen=True)
class Block:
    index: int
    lang: str
    marker: str
    body: str

    @property
    def skip_reason(self) -> str | None:
        if self.marker == "deploy-only":
            return "deploy-only: needs an AWS account"
        if self.marker.startswith("tutorial-skip:"):
            return self.marker.removeprefix("tutorial-skip:").strip()
        return None


def blocks() -> list[Block]:
    return [Block(i, m["lang"], m["marker"] or "", m["body"])
            for i, m in enumerate(_BLOCK.finditer(TUTORIAL.read_text()))]  # fmt: skip


def test_every_file_block_names_its_file_where_a_reader_sees_it() -> None:
    # The marker is an HTML comment a rendered page hides: the path must also be text.
    text = TUTORIAL.read_text()
    files = [m.start() for m in re.finditer(r"<!--\s*file:", text)]
    assert files, "the tutorial writes files"
    for block in (b for b in blocks() if b.marker.startswith("file:")):
        path = block.marker.removeprefix("file:").strip()
        comment = text.index(f"<!-- {block.marker} -->")
        before = text[:comment].rstrip().rsplit("\n", 1)[-1]
        assert f"`{path}`" in before, f"no visible name above the block for {path}: {before!r}"


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("AGENTQ_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _result(env: dict[str, str], home: Path, definition: str, task_input: str, key: str) -> Any:
    def agentq(*args: str) -> str:
        return subprocess.run(["agentq", "--local", *args], env=env, cwd=home, text=True,
                              capture_output=True, check=True, timeout=60).stdout  # fmt: skip

    request_id = agentq("submit", definition, "--input", task_input, "--idempotency-key", key)
    return json.loads(agentq("result", request_id.strip(), "--json"))


def _wait_for_background(path: Path, process: subprocess.Popen[str]) -> None:
    wait_for(lambda: path.exists() or process.poll() is not None, timeout=120,
             message=f"{path} (background block)")  # fmt: skip
    assert process.poll() is None, process.communicate()[0][-4000:]


@pytest.mark.parametrize(
    "block", [b for b in blocks() if b.skip_reason], ids=lambda b: f"block{b.index}"
)
def test_tutorial_block_not_run_here(block: Block) -> None:
    assert block.lang == "bash", "only shell blocks may be skipped"
    pytest.skip(f"{block.skip_reason}: {block.body.strip().splitlines()[0]}")


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_tutorial_runs_in_order_on_the_local_stack(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    state, cwd = tmp_path / "state.sh", tmp_path / "cwd"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT", "SQS_"))}
    env.update(AGENTQ_TEST_MARKER=marker, COLUMNS="160",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")  # fmt: skip
    for name in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "TASK_DEFINITIONS_DIR",
                 "DYNAMODB_EVENTS_TABLE_NAME", "S3_BUCKET", "EVENTBRIDGE_BUS_NAME"):  # fmt: skip
        env.pop(name, None)
    (tmp_path / "home").mkdir()
    cwd.write_text(str(tmp_path / "home"))
    state.write_text("")
    background: list[subprocess.Popen[str]] = []
    wait_file: Path | None = None
    ran = 0
    try:
        for block in blocks():
            here = Path(cwd.read_text().strip())
            if block.skip_reason:
                continue
            if block.marker.startswith("file:"):
                target = here / block.marker.removeprefix("file:").strip()
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.body)
                continue
            if block.lang != "bash":
                continue
            if wait_file is not None:
                _wait_for_background(wait_file, background[-1])
                wait_file = None
            script = (f'cd "$(cat {cwd})"\nsource {state}\nset -euo pipefail\n{block.body}\n'
                      f'export -p > {state}\npwd > {cwd}\n')  # fmt: skip
            if block.marker.startswith("background:"):
                wait_file = here / block.marker.removeprefix("background:").strip()
                # Its own process group: Ctrl-C reaches the command, as in a terminal.
                background.append(subprocess.Popen(
                    ["bash", "-c", f'cd "$(cat {cwd})"\nsource {state}\n{block.body}'],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    start_new_session=True,
                ))  # fmt: skip
                continue
            done = subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                                  text=True, timeout=240, check=False)  # fmt: skip
            assert done.returncode == 0, (
                f"tutorial block {block.index} failed ({done.returncode}):\n{block.body}\n"
                f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
            )
            ran += 1
        assert ran >= 6
        home = Path(cwd.read_text().strip())
        assert (home / "trace.json").read_text().strip().startswith("{")
        # What the reader's tasks returned (the same idempotency keys find them again).
        count = _result(env, home, "word-count", '{"text": "agentq runs tasks in the background"}',
                        "first-count")  # fmt: skip
        assert count == {"words": 6, "longest": "background"}
        headline = _result(env, home, "headline",
                           '{"article": "The city opened its third bike lane this year."}',
                           "first-headline")  # fmt: skip
        assert set(headline) == {"headline", "summary"}
    finally:
        for process in background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    assert all(p.returncode == 0 for p in background), [p.returncode for p in background]
    wait_for(lambda: not _marked(marker), timeout=30, message="no process left")
