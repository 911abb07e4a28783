"""docs/deploy.md's runbook, executed as far as this machine can: agentq's own account
commands run without credentials, where each must stop with one line that shows the
region and says what to do; every other command must be one that needs the account or
runs anywhere (`make synth`, run by tests/infra/test_infra_cli.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from infra_synth import synthesized
from runbook import ACCOUNT, LOCAL, OWN, RUNBOOK, runbook_commands

from agentq.local.stack import format_env_file
from agentq.resources import ResourceNames

REPO = Path(__file__).resolve().parents[2]


def test_every_runbook_command_is_local_agentqs_own_or_needs_the_account() -> None:
    commands = runbook_commands()
    assert len(commands) > 10
    unknown = [c for c in commands if not (ACCOUNT.match(c) or OWN.match(c) or LOCAL.match(c))]
    assert not unknown
    # The secrets are set through stack outputs, never by a name nobody created.
    assert not re.search(r"--secret-id agentq-", RUNBOOK.read_text())
    assert any("ClaudeApiKeySecretArn" in c for c in commands)


def test_the_outputs_the_runbook_reads_exist(tmp_path_factory: pytest.TempPathFactory) -> None:
    dev = synthesized("dev", tmp_path_factory)
    text = RUNBOOK.read_text()
    for stack, output in re.findall(
        r"--stack-name agentq-\$STAGE-([a-z-]+).*?OutputKey=='(\w+)'", text, re.S
    ):
        assert output in dev.json(stack).get("Outputs", {}), (stack, output)


def _no_credentials(tmp_path: Path, region: str | None) -> dict[str, str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "STAGE": "dev",
    }
    if region:
        env["AWS_REGION"] = region
    return env


@pytest.mark.parametrize("region", ["eu-west-1", None])
def test_agentqs_account_commands_without_credentials_end_in_one_line_with_the_region(
    tmp_path: Path, region: str | None
) -> None:
    env = _no_credentials(tmp_path, region)
    # What `agentq env` would have written, so the commands after it have their stage.
    names = ResourceNames(stage="dev")
    queue = f"https://sqs.{region or 'eu-west-1'}.amazonaws.com/123456789012"
    stage_env = {
        "SQS_QUEUE_URL": f"{queue}/{names.task_queue}",
        "SQS_DLQ_URL": f"{queue}/{names.dead_letter_queue}",
        "DYNAMODB_EVENTS_TABLE_NAME": names.events_table,
        "TASK_DEFINITIONS_TABLE": names.definitions_table,
        "EVENTBRIDGE_BUS_NAME": names.event_bus,
        "S3_BUCKET": "agentq-dev-artifacts-example",
        "AGENTQ_STAGE": "dev",
    }
    (tmp_path / "dev.env").write_text(format_env_file(stage_env, header="# test\n"))
    ran = 0
    for command in runbook_commands():
        if not OWN.match(command):
            continue
        script = command.replace(".venv/bin/python", str(REPO / ".venv/bin/python"))
        if command.startswith("agentq submit"):
            script = f"set -a; . {tmp_path / 'dev.env'}; set +a; {script}"
        result = subprocess.run(
            ["bash", "-c", script],
            check=False,
            cwd=tmp_path,
            env={**env, "PATH": f"{REPO / '.venv/bin'}:{env['PATH']}"},
            capture_output=True,
            text=True,
            timeout=180,
        )
        ran += 1
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0, command
        assert len(lines) == 1, (command, result.stderr)
        assert f"region {region or 'eu-west-1'}" in lines[0], (command, lines[0])
        assert "region ?" not in lines[0]
        assert re.search(r"configure|AWS_PROFILE", lines[0]), lines[0]  # what to do
    assert ran == 3
