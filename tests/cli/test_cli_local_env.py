"""The env file `agentq local up` writes: only agentq's and AWS's variables, readable by a
shell and by `agentq --local`, from any directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_support import REPO, agentq, fresh_shell, one_line_error
from conftest import Stack
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.cli._localenv import allowed_variable, parse_env_file
from agentq.config import env_names
from agentq.errors import ConfigError
from agentq.local.stack import format_env_file

pytestmark = pytest.mark.timeout(300)

_NAMES = sorted(env_names() | {"AWS_ENDPOINT_URL"})
# Any text a variable can hold on one line (no NUL, no newline), quotes and `$(...)` included.
_VALUES = st.text(st.characters(exclude_characters="\x00\n", exclude_categories=["Cs"]))


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(_NAMES), _VALUES, max_size=8))
def test_the_env_file_reads_back_exactly_what_was_written(env: dict[str, str]) -> None:
    assert parse_env_file(format_env_file(env)) == env


def test_a_value_with_a_newline_is_refused_when_writing() -> None:
    with pytest.raises(ConfigError, match="S3_BUCKET"):
        format_env_file({"S3_BUCKET": "two\nlines"})


def test_a_shell_sourcing_the_file_gets_the_same_values(tmp_path: Path) -> None:
    env = {
        "S3_BUCKET": 'it\'s $(rm -rf /) `x` "q"',
        "TASK_DEFINITIONS_DIR": "/a b/c:/d\x85\u2028 e",
    }
    path = tmp_path / "local.env"
    path.write_text(format_env_file(env))
    printed = subprocess.run(
        ["bash", "-c", f'source "{path}"; printf "%s\\0%s" "$S3_BUCKET" "$TASK_DEFINITIONS_DIR"'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert printed.split("\0") == [env["S3_BUCKET"], env["TASK_DEFINITIONS_DIR"]]


@pytest.mark.parametrize(
    "name", ["HOME", "PATH", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "LD_PRELOAD"]
)
def test_nothing_but_agentq_and_aws_variables_is_accepted(name: str, tmp_path: Path) -> None:
    assert not allowed_variable(name)
    text = format_env_file({"S3_BUCKET": "b", name: "x"})
    with pytest.raises(ConfigError, match=name):
        parse_env_file(text)
    path = tmp_path / "local.env"
    path.write_text(text)
    ran = agentq(fresh_shell(), "--local-env", str(path), "status", "t-1")
    assert ran.code == 5 and name in one_line_error(ran)


@given(st.text(max_size=200))
def test_any_file_parses_or_is_refused_as_a_configuration_error(text: str) -> None:
    try:
        env = parse_env_file(text)
    except ConfigError:
        return
    assert all(allowed_variable(name) for name in env)


def test_local_without_a_running_stack_says_to_start_it(tmp_path: Path) -> None:
    ran = agentq(fresh_shell(), "--local", "job", "list", "--json", cwd=tmp_path)
    assert ran.code == 5
    assert "agentq local up" in one_line_error(ran)
    assert ran.json()["error"]["kind"] == "config"


def test_local_finds_the_file_from_a_subdirectory_without_sourcing(
    stack: Stack, tmp_path: Path
) -> None:
    env = {**stack.env(), "TASK_DEFINITIONS_DIR": str(REPO / "definitions" / "testing")}
    (tmp_path / ".agentq").mkdir()
    (tmp_path / ".agentq" / "local.env").write_text(format_env_file(env))
    deep = tmp_path / "src" / "pkg"
    deep.mkdir(parents=True)
    shell = fresh_shell()
    submitted = agentq(shell, "--local", "submit", "sample-echo", "--input", "{}", "--json",
                       cwd=deep)  # fmt: skip
    assert submitted.code == 0, submitted
    status = agentq(shell, "--local", "status", submitted.json()["requestId"], "--json", cwd=deep)
    assert status.json()["state"] == "PENDING"


def test_local_up_adds_your_definitions_to_the_samples_unless_told_not_to(
    tmp_path: Path,
) -> None:
    from agentq.cli import build_parser
    from agentq.cli.local import _definitions_dirs
    from agentq.local.stack import SAMPLE_DEFINITIONS

    mine = tmp_path / "mine"
    mine.mkdir()
    args = build_parser().parse_args(["local", "up", "--definitions", str(mine)])
    assert _definitions_dirs(args, SAMPLE_DEFINITIONS) == (SAMPLE_DEFINITIONS, mine.resolve())
    args = build_parser().parse_args(["local", "up", "--definitions", str(mine), "--no-samples"])
    assert _definitions_dirs(args, SAMPLE_DEFINITIONS) == (mine.resolve(),)


def test_local_up_refuses_a_definitions_path_that_is_not_a_directory(tmp_path: Path) -> None:
    from agentq.cli import main

    assert main(["local", "up", "--definitions", str(tmp_path / "nope")]) == 2
