"""The definitions the deployment loads: the custom resource, its bundle asset and hash,
and the least privilege of the loader and of the provider framework's roles."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

# Before jsii starts (first aws_cdk import): Node 20's end-of-life banner is noise here.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Match, Template
from infra_synth import REPO, SynthesizedStage, synthesized

from agentq.definitions import load_directory
from agentq.errors import InvalidInput
from infra.app import definitions_context
from infra.definitions import RESOURCE_TYPE, DefinitionsLoader
from infra.stages import SAMPLE_DEFINITIONS, StageError, stage_settings

pytestmark = pytest.mark.timeout(600)

SAMPLES = REPO / "definitions" / "samples"
LOADER = "lambdas.definitions_loader.handler"


@pytest.fixture(scope="module", params=["dev", "prod"])
def stage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> SynthesizedStage:
    return synthesized(request.param, tmp_path_factory)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _role_statements(template: dict[str, Any], function_id: str) -> list[dict[str, Any]]:
    role = template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    return [
        statement
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::IAM::Policy"
        and {"Ref": role} in resource["Properties"]["Roles"]
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]


def _function_id(template: dict[str, Any], handler: str) -> str:
    [found] = [
        str(logical_id)
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function"
        and resource["Properties"]["Handler"] == handler
    ]
    return found


def _by_action(statements: list[dict[str, Any]]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for statement in statements:
        for action in _as_list(statement["Action"]):
            found.setdefault(action, []).extend(_as_list(statement["Resource"]))
    return found


def test_infra_the_core_stack_loads_the_sample_definitions_through_a_custom_resource(
    stage: SynthesizedStage,
) -> None:
    loader = stage.stacks.definitions
    template = stage.templates["infrastructure"]
    table_id = stage.stacks.infrastructure.get_logical_id(
        stage.stacks.infrastructure.definitions_table.node.default_child  # type: ignore[arg-type]
    )
    template.has_resource_properties(
        RESOURCE_TYPE,
        {
            "ServiceToken": {"Fn::GetAtt": [Match.string_like_regexp("Provider"), "Arn"]},
            "TableName": {"Ref": table_id},
            "BundleBucket": Match.any_value(),
            "BundleKey": f"{loader.bundle.asset_hash}.zip",
            # Any change of any definition is a new hash, so a new Update of the resource.
            "BundleHash": loader.bundle.asset_hash,
            "Definitions": sorted(load_directory(SAMPLES)),
            # CloudFormation gives up on a silent provider after this, not after an hour.
            "ServiceTimeout": "1200",
        },
    )
    template.resource_count_is(RESOURCE_TYPE, 1)
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Handler": LOADER, "Timeout": 300, "TracingConfig": Match.any_value()},
    )


def test_infra_the_loader_may_only_write_definitions_and_read_its_bundle(
    stage: SynthesizedStage,
) -> None:
    template = stage.json("infrastructure")
    by_action = _by_action(_role_statements(template, _function_id(template, LOADER)))
    assert {a for a in by_action if not a.startswith(("logs:", "xray:"))} == {
        "dynamodb:Scan",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
        "s3:GetObject",
    }
    for action in ("dynamodb:Scan", "dynamodb:PutItem", "dynamodb:DeleteItem"):
        text = json.dumps(by_action[action])
        assert "DefinitionsTable" in text and "EventsTable" not in text
        assert "/index/" not in text and "*" not in text
    [bundle_object] = by_action["s3:GetObject"]
    text = json.dumps(bundle_object)
    assert f"{stage.stacks.definitions.bundle.asset_hash}.zip" in text and "*" not in text


def test_infra_the_provider_framework_may_only_invoke_the_loader(stage: SynthesizedStage) -> None:
    template = stage.json("infrastructure")
    loader_id = _function_id(template, LOADER)
    framework_id = _function_id(template, "framework.onEvent")
    by_action = _by_action(_role_statements(template, framework_id))
    # GetFunction: the framework waits for a loader still starting up before it invokes.
    assert {a for a in by_action if not a.startswith("logs:")} == {
        "lambda:InvokeFunction",
        "lambda:GetFunction",
    }
    for resource in by_action["lambda:InvokeFunction"] + by_action["lambda:GetFunction"]:
        assert loader_id in json.dumps(resource)
    # Its own log group with the stage's retention, not one Lambda makes unbounded.
    framework = template["Resources"][framework_id]["Properties"]
    assert "LoggingConfig" in framework


# -- without a stage synth: one construct in a bare stack ------------------------------------


def _loader_template(tmp_path: Path, *directories: Path) -> tuple[DefinitionsLoader, Template]:
    settings = replace(stage_settings("dev"), definitions=directories)
    stack = cdk.Stack(cdk.App(outdir=str(tmp_path / "out")), "agentq-test")
    table = dynamodb.Table(
        stack,
        "Definitions",
        partition_key=dynamodb.Attribute(name="name", type=dynamodb.AttributeType.STRING),
    )
    loader = DefinitionsLoader(
        stack,
        "DefinitionsLoader",
        settings=settings,
        table=table,
        code=lambda_.Code.from_inline("def handler(event, context): pass"),
        repo_root=tmp_path,
    )
    return loader, Template.from_stack(stack)


def _hash(template: Template) -> str:
    [resource] = template.find_resources(RESOURCE_TYPE).values()
    return str(resource["Properties"]["BundleHash"])


def test_infra_a_changed_definition_changes_the_bundle_hash(tmp_path: Path) -> None:
    mine = tmp_path / "my_definitions"
    mine.mkdir()
    task = mine / "own.yaml"
    task.write_text("name: own-task\nkind: python\ndescription: one\nsettings: {}\n")
    first, template = _loader_template(tmp_path, mine)
    same = _hash(_loader_template(tmp_path, mine)[1])
    task.write_text("name: own-task\nkind: python\ndescription: two\nsettings: {}\n")
    changed = _hash(_loader_template(tmp_path, mine)[1])

    assert _hash(template) == first.bundle.asset_hash == same
    assert changed != same
    assert first.names == ["own-task"]


def test_infra_a_bad_definition_fails_synth_naming_the_file(tmp_path: Path) -> None:
    mine = tmp_path / "my_definitions"
    mine.mkdir()
    (mine / "broken.yaml").write_text("name: Not A Name\nkind: python\n")
    with pytest.raises(InvalidInput, match=r"my_definitions/broken.yaml: name"):
        _loader_template(tmp_path, mine)
    with pytest.raises(InvalidInput, match=r"no such directory"):
        _loader_template(tmp_path, tmp_path / "missing")
    # Longer than SQS can keep a running task's message hidden: refused before deploy.
    (mine / "broken.yaml").write_text("name: long-task\nkind: python\ntimeout_s: 86400\n")
    with pytest.raises(InvalidInput, match=r"broken.yaml: timeout_s: must be at most 39600 s"):
        _loader_template(tmp_path, mine)


def test_infra_the_stage_ships_the_samples_plus_the_deploy_commands_directories() -> None:
    assert stage_settings("prod").definitions == SAMPLE_DEFINITIONS
    extra = definitions_context("my_definitions, more/defs")
    assert extra == [Path("my_definitions"), Path("more/defs")]
    assert definitions_context(None) == [] and definitions_context("  ") == []
    shipped = stage_settings("dev", definitions=[*extra, Path("definitions/samples")]).definitions
    assert shipped == (*SAMPLE_DEFINITIONS, Path("my_definitions"), Path("more/defs"))
    with pytest.raises(StageError, match=r"named twice"):
        replace(stage_settings("dev"), definitions=(Path("a"), Path("a")))
