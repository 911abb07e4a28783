"""Every command, when AWS or the stack is not there, ends in one line saying what to do,
with a documented exit code and, under `--json`, an error object on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import agentq, fresh_shell, one_line_error
from conftest import Stack

from agentq.config import Settings
from agentq.definitions import DefinitionsTable, TaskDefinition
from agentq.local.aws import free_port

pytestmark = pytest.mark.timeout(300)

# Each command a newcomer tries first, with the arguments it needs.
COMMANDS = (
    ("status", "t-1"),
    ("events", "t-1"),
    ("result", "t-1"),
    ("logs", "t-1"),
    ("trace", "t-1"),
    ("submit", "sample-echo", "--input", "{}"),
    ("cancel", "t-1"),
    ("watch", "--once"),
    ("job", "list"),
    ("definitions", "list"),
)


def _dead_stack_env() -> dict[str, str]:
    # What a stale .agentq/local.env leaves in a shell: names of a stack whose server is gone.
    dead = f"http://127.0.0.1:{free_port()}"
    return fresh_shell(
        AWS_ENDPOINT_URL=dead,
        AGENTQ_LOCAL="1",
        SQS_QUEUE_URL=f"{dead}/123456789012/gone",
        DYNAMODB_EVENTS_TABLE_NAME="gone-events",
        TASK_DEFINITIONS_TABLE="gone-definitions",
        EVENTBRIDGE_BUS_NAME="gone-bus",
        S3_BUCKET="gone-bucket",
    )


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_a_dead_local_stack_gives_one_line_naming_the_endpoint_and_the_fix(
    args: tuple[str, ...],
) -> None:
    env = _dead_stack_env()
    ran = agentq(env, *args)
    assert ran.code == 8, ran
    line = one_line_error(ran)
    assert f"cannot reach AWS at {env['AWS_ENDPOINT_URL']}" in line
    assert "agentq local up" in line and "source .agentq/local.env" in line
    assert ran.stdout == "" or args[0] == "watch"

    as_json = agentq(env, *args, "--json")
    assert as_json.code == 8, as_json
    error = as_json.json()["error"]
    assert (error["code"], error["kind"]) == (8, "unreachable")
    assert env["AWS_ENDPOINT_URL"] in error["message"] and "agentq local up" in error["hint"]


def test_missing_variables_name_the_variable_and_what_to_do() -> None:
    # As the installed command: the exit code and the one line a shell sees.
    ran = agentq(fresh_shell(), "status", "t-1", process=True)
    assert ran.code == 5, ran
    line = one_line_error(ran)
    assert "is required" in line and "agentq local up" in line
    error = agentq(fresh_shell(), "job", "list", "--json").json()["error"]
    assert error["kind"] == "config" and error["code"] == 5


def test_resources_of_a_stopped_stack_on_a_live_endpoint_say_to_restart(stack: Stack) -> None:
    env = fresh_shell(**stack.env())
    env["DYNAMODB_EVENTS_TABLE_NAME"] = "no-such-table"
    ran = agentq(env, "status", "t-1", "--json")
    assert ran.code == 8, ran
    assert "restart `agentq local up`" in one_line_error(ran)
    assert ran.json()["error"]["kind"] == "missing_resource"


def test_no_credentials_is_a_configuration_error(stack: Stack, tmp_path: Path) -> None:
    env = fresh_shell(**stack.env())
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        env.pop(name, None)
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    ran = agentq(env, "status", "t-1")
    assert ran.code == 5, ran
    assert "no AWS credentials" in one_line_error(ran)


def test_usage_errors_under_json_still_print_a_json_error() -> None:
    ran = agentq(fresh_shell(), "status", "--json", process=True)
    assert ran.code == 2
    assert ran.json()["error"]["kind"] == "usage"


def test_an_unknown_task_points_at_the_tenant_producer_api_tasks_live_under(stack: Stack) -> None:
    ran = agentq(fresh_shell(**stack.env()), "status", "from-the-api")
    assert ran.code == 3, ran
    line = one_line_error(ran)
    assert "tenant 'default'" in line and "--tenant TENANT" in line
    assert "agentq tenants list" in line


def test_the_region_falls_back_like_boto3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({"AWS_DEFAULT_REGION": "ap-south-1"}).region == "ap-south-1"
    assert Settings.from_env({"AWS_REGION": "us-west-2",
                              "AWS_DEFAULT_REGION": "ap-south-1"}).region == "us-west-2"  # fmt: skip
    config = tmp_path / "config"
    config.write_text("[profile work]\nregion = sa-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert Settings.from_env({"AWS_PROFILE": "work"}).region == "sa-east-1"
    assert Settings.from_env({}).region == "eu-west-1"


def test_every_error_kind_is_explained_in_troubleshooting() -> None:
    import re

    from cli_support import REPO

    from agentq.cli import _errors, common

    source = Path(_errors.__file__).read_text()
    kinds = set(re.findall(r'Failure\(\s*EXIT_\w+,\s*"(\w+)"', source))
    kinds |= set(common._KINDS.values()) | {"usage"}
    assert {"unreachable", "missing_resource", "credentials", "config"} <= kinds
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    missing = sorted(k for k in kinds if f"| `{k}` |" not in page)
    assert not missing, f"docs/troubleshooting.md lacks a row for {missing}"


def test_continuing_a_task_the_tenant_does_not_have_is_refused_in_one_line(
    stack: Stack,
) -> None:
    agent = {"prompt": "Note {text}", "output_schema": {"type": "object"}, "resume": True}
    DefinitionsTable(stack.dynamodb, stack.resources.definitions_table).put(
        TaskDefinition(name="notes", kind="agent", settings=agent)
    )
    shell = fresh_shell(**stack.env())
    ran = agentq(shell, "submit", "notes", "--continue", "r-elsewhere", "--prompt", "And?")
    assert ran.code == 6, ran
    assert "continues: task r-elsewhere was not found" in one_line_error(ran)
    ran = agentq(shell, "submit", "notes", "--prompt", "And?", "--json")
    assert ran.code == 6, ran
    assert "prompt: is only for a task that continues another" in ran.stdout
