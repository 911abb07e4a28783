"""The deploy path from the CLI: `agentq env --stage` turns a deployed stage into the
variables producers need, and `agentq definitions sync` loads the definitions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import pytest
from cli_support import REPO, agentq, fresh_shell, one_line_error
from conftest import Stack

from agentq.local.aws import LOCAL_REGION

pytestmark = pytest.mark.timeout(300)

SAMPLES = REPO / "definitions" / "samples"


def test_definitions_sync_loads_updates_and_prunes(stack: Stack, tmp_path: Path) -> None:
    shell = fresh_shell(**stack.env())  # the table only, as on a deployed stage
    first = agentq(shell, "definitions", "sync", str(SAMPLES), "--json")
    assert first.code == 0, first
    names = first.json()["added"]
    assert "summarize" in names and first.json()["updated"] == []
    again = agentq(shell, "definitions", "sync", str(SAMPLES), "--json").json()
    assert again["unchanged"] == names and again["added"] == []

    mine = tmp_path / "defs"
    shutil.copytree(SAMPLES, mine, ignore=shutil.ignore_patterns("inputs", "report.yaml"))
    summarize = mine / "summarize.yaml"
    summarize.write_text(summarize.read_text().replace("max_attempts: 3", "max_attempts: 2"))
    changed = agentq(shell, "definitions", "sync", str(mine), "--prune", "--json").json()
    assert changed["updated"] == ["summarize"] and changed["deleted"] == ["report"]
    listed = agentq(shell, "definitions", "list", "--json").json()
    assert {d["name"]: d.get("max_attempts") for d in listed}["summarize"] == 2
    ok = agentq(shell, "submit", "summarize", "--input", '{"document": "d"}')
    assert ok.code == 0, ok

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.yaml").write_text("name: Bad Name\nkind: agent\n")
    refused = agentq(shell, "definitions", "sync", str(broken), "--json")
    assert refused.code == 6 and "name" in one_line_error(refused)


def test_env_for_a_stage_reads_names_urls_and_the_bucket(stack: Stack, tmp_path: Path) -> None:
    names = stack.resources.names
    cloudformation = boto3.client(
        "cloudformation", region_name=LOCAL_REGION, endpoint_url=stack.resources.endpoint_url
    )
    template = {"Resources": {"ArtifactsB1A2C3D4": {"Type": "AWS::S3::Bucket"}}}
    cloudformation.create_stack(
        StackName=f"{names.prefix}-infrastructure", TemplateBody=json.dumps(template)
    )
    bucket = cloudformation.describe_stack_resource(
        StackName=f"{names.prefix}-infrastructure", LogicalResourceId="ArtifactsB1A2C3D4"
    )["StackResourceDetail"]["PhysicalResourceId"]
    endpoints = {k: v for k, v in stack.env().items() if k.startswith("AWS_ENDPOINT_URL")}
    shell = fresh_shell(**endpoints, AWS_REGION=LOCAL_REGION)

    ran = agentq(shell, "env", "--stage", names.stage, "--json")
    assert ran.code == 0, ran
    assert ran.json() == {
        "AWS_REGION": LOCAL_REGION,
        "AGENTQ_STAGE": names.stage,
        "APP_NAME": "agentq",
        "SQS_QUEUE_URL": stack.resources.queue_url,
        # Every priority tier's queue (the default tier's is SQS_QUEUE_URL).
        "SQS_QUEUE_URLS": ",".join(f"{t}={u}" for t, u in stack.resources.tier_queues.items()),
        "SQS_DLQ_URL": stack.resources.dlq_url,
        "DYNAMODB_EVENTS_TABLE_NAME": stack.resources.table_name,
        "TASK_DEFINITIONS_TABLE": stack.resources.definitions_table,
        "EVENTBRIDGE_BUS_NAME": stack.resources.bus_name,
        "S3_BUCKET": bucket,
    }
    env_file = tmp_path / "stage.env"
    assert agentq(shell, "env", "--stage", names.stage, "--output", str(env_file)).code == 0
    listed = agentq(shell, "--local-env", str(env_file), "job", "list", "--json")
    assert listed.code == 0 and listed.json() == []

    missing = agentq(shell, "env", "--stage", "nosuchstage", "--json")
    assert missing.code == 3
    assert "agentq-nosuchstage-infrastructure" in one_line_error(missing)
