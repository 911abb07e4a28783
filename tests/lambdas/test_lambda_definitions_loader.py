"""definitions-loader: the deployment's custom resource, run against moto as
CloudFormation's provider framework calls it (Create, Update, Delete, a bad bundle)."""

from __future__ import annotations

import io
import shutil
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack

from agentq.definitions import DefinitionsTable, load_directory
from agentq.definitions.bundle import stage_bundle
from agentq.definitions.sync import DefinitionSource
from agentq.errors import InvalidInput, OutOfTime
from agentq.local.lambda_host import LocalContext
from lambdas import definitions_loader

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "definitions" / "samples"
# The Lambda service's context object, as the local Lambda host builds it.
# The loader's deployed timeout (infra/definitions.py LOADER_TIMEOUT, 5 minutes): with
# the local context's 30 s, its 15 s safety margin left a loaded test machine too little.
CTX: Any = LocalContext(function_name="definitions-loader", timeout_ms=300_000)


def _zip(directory: Path) -> bytes:
    """The archive cdk-assets makes of a directory asset: relative paths, files only."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


class Deployment:
    """What CloudFormation and the CDK asset publisher do around the handler."""

    def __init__(self, stack: Stack, tmp_path: Path) -> None:
        self.stack = stack
        self.tmp = tmp_path
        self.table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
        self.previous: dict[str, Any] | None = None

    def properties(
        self, *directories: tuple[Path, str], names: list[str] | None = None
    ) -> dict[str, Any]:
        bundle = self.tmp / uuid.uuid4().hex
        stage_bundle([DefinitionSource(d, label) for d, label in directories], bundle)
        key = f"assets/{uuid.uuid4().hex}.zip"
        self.stack.s3.put_object(Bucket=self.stack.resources.bucket, Key=key, Body=_zip(bundle))
        if names is None:
            names = sorted(name for d, _ in directories for name in load_directory(d))
        return {
            "ServiceToken": "arn:aws:lambda:eu-west-1:000000000000:function:provider",
            "TableName": self.stack.resources.definitions_table,
            "BundleBucket": self.stack.resources.bucket,
            "BundleKey": key,
            "BundleHash": key.removesuffix(".zip"),
            "Definitions": names,
        }

    def event(self, request: str, properties: dict[str, Any]) -> dict[str, Any]:
        event: dict[str, Any] = {
            "RequestType": request,
            "ServiceToken": properties["ServiceToken"],
            "ResponseURL": "https://cloudformation-custom-resource-response.example/",
            "StackId": "arn:aws:cloudformation:eu-west-1:000000000000:stack/agentq-t/1",
            "RequestId": uuid.uuid4().hex,
            "LogicalResourceId": "DefinitionsLoaderDefinitions",
            "ResourceType": "Custom::AgentqDefinitions",
            "ResourceProperties": properties,
        }
        if request != "Create":
            event["PhysicalResourceId"] = definitions_loader.physical_id(
                self.stack.resources.definitions_table
            )
        if request == "Update":
            assert self.previous is not None
            event["OldResourceProperties"] = self.previous
        return event

    def apply(self, request: str, properties: dict[str, Any], context: Any = CTX) -> dict[str, Any]:
        result = definitions_loader.handler(self.event(request, properties), context)
        if request != "Delete":
            self.previous = properties
        return result

    def stored(self) -> dict[str, dict[str, Any]]:
        return {d.name: d.to_dict() for d in self.table.all()}


@pytest.fixture
def deployment(stack: Stack, tmp_path: Path) -> Deployment:
    return Deployment(stack, tmp_path)


def _copy(tmp_path: Path, name: str) -> Path:
    mine = tmp_path / name
    shutil.copytree(SAMPLES, mine, ignore=shutil.ignore_patterns("inputs"))
    return mine


def test_create_loads_every_definition_and_a_rerun_changes_nothing(
    deployment: Deployment,
) -> None:
    properties = deployment.properties((SAMPLES, "definitions/samples"))
    created = deployment.apply("Create", properties)

    expected = {name: d.to_dict() for name, d in load_directory(SAMPLES).items()}
    assert deployment.stored() == expected
    assert created["PhysicalResourceId"] == definitions_loader.physical_id(
        deployment.stack.resources.definitions_table
    )
    assert created["Data"]["Added"] == len(expected)
    # CloudFormation may send the same request again (a retried deploy): same table.
    again = deployment.apply("Create", properties)
    assert again["Data"] == {"Added": 0, "Updated": 0, "Unchanged": len(expected), "Deleted": 0}
    assert deployment.stored() == expected


def test_update_writes_a_changed_definition_and_deletes_one_no_longer_shipped(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.apply("Create", deployment.properties((SAMPLES, "definitions/samples")))
    # A definition someone put by hand is not the deployment's to delete.
    own = load_directory(SAMPLES)["report"].model_copy(update={"name": "hand-made"})
    deployment.table.put(own)
    mine = _copy(tmp_path, "defs")
    (mine / "report.yaml").unlink()
    summarize = mine / "summarize.yaml"
    summarize.write_text(summarize.read_text().replace("max_attempts: 3", "max_attempts: 2"))

    updated = deployment.apply("Update", deployment.properties((mine, "defs")))

    assert updated["Data"]["Updated"] == 1 and updated["Data"]["Deleted"] == 1
    stored = deployment.stored()
    assert "report" not in stored and "hand-made" in stored
    assert stored["summarize"]["max_attempts"] == 2
    assert set(stored) == set(load_directory(mine)) | {"hand-made"}


def test_rollback_after_a_failed_update_returns_the_previous_definitions(
    deployment: Deployment, tmp_path: Path
) -> None:
    old = deployment.properties((SAMPLES, "definitions/samples"))
    deployment.apply("Create", old)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "new.yaml").write_text("name: brand-new\nkind: python\nsettings: {}\n")
    new = deployment.properties((SAMPLES, "definitions/samples"), (extra, "extra"))
    deployment.apply("Update", new)
    assert "brand-new" in deployment.stored()

    # A later stack resource failed: CloudFormation rolls back with an Update to the old.
    deployment.apply("Update", old)

    assert deployment.stored() == {n: d.to_dict() for n, d in load_directory(SAMPLES).items()}


def test_a_malformed_definition_fails_naming_the_file_and_writes_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.apply("Create", deployment.properties((SAMPLES, "definitions/samples")))
    before = deployment.stored()
    mine = _copy(tmp_path, "my_definitions")
    summarize = mine / "summarize.yaml"
    summarize.write_text(summarize.read_text().replace("max_attempts: 3", "max_attempts: 2"))
    (mine / "zz_bad.yaml").write_text("name: Bad Name\nkind: agent\n")
    properties = deployment.properties((mine, "my_definitions"), names=[])

    # The provider framework reports str(error) to CloudFormation as the reason.
    with pytest.raises(InvalidInput, match=r"^my_definitions/zz_bad\.yaml: name: "):
        deployment.apply("Update", properties)

    assert deployment.stored() == before  # summarize's change was not written either


def test_an_unparsable_file_is_named_in_the_reason(deployment: Deployment, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "oops.yaml").write_text("name: [unclosed\n")
    properties = deployment.properties((SAMPLES, "definitions/samples"))
    bundle = tmp_path / "bundle"
    stage_bundle([DefinitionSource(broken, "my_definitions")], bundle)
    deployment.stack.s3.put_object(
        Bucket=properties["BundleBucket"], Key=properties["BundleKey"], Body=_zip(bundle)
    )

    with pytest.raises(InvalidInput, match=r"^my_definitions/oops\.yaml: unreadable"):
        deployment.apply("Create", properties)
    assert deployment.stored() == {}


def test_a_stored_item_that_is_no_definition_is_replaced(deployment: Deployment) -> None:
    deployment.stack.dynamodb.put_item(
        TableName=deployment.stack.resources.definitions_table,
        Item={"name": {"S": "summarize"}, "kind": {"S": "no-such-kind"}},
    )
    deployment.apply("Create", deployment.properties((SAMPLES, "definitions/samples")))
    assert deployment.stored()["summarize"] == load_directory(SAMPLES)["summarize"].to_dict()


def test_delete_leaves_the_table_as_it_is_whatever_the_properties(
    deployment: Deployment,
) -> None:
    properties = deployment.properties((SAMPLES, "definitions/samples"))
    deployment.apply("Create", properties)
    before = deployment.stored()

    deleted = deployment.apply("Delete", properties)
    # A Create that failed on its properties must still be deletable, or no rollback ends.
    broken = deployment.event("Delete", {"ServiceToken": "x"})
    again = definitions_loader.handler(broken, CTX)

    assert deleted["PhysicalResourceId"] == broken["PhysicalResourceId"]
    assert again["PhysicalResourceId"] == broken["PhysicalResourceId"]
    assert deployment.stored() == before


def test_out_of_time_stops_before_a_write_and_a_rerun_converges(
    deployment: Deployment,
) -> None:
    properties = deployment.properties((SAMPLES, "definitions/samples"))
    short: Any = LocalContext(function_name="definitions-loader", timeout_ms=1_000)

    with pytest.raises(OutOfTime, match=r"run it again"):
        deployment.apply("Create", properties, short)
    assert deployment.stored() == {}

    deployment.apply("Create", properties)
    assert set(deployment.stored()) == set(load_directory(SAMPLES))


def test_a_missing_property_or_bundle_is_refused(deployment: Deployment) -> None:
    properties = deployment.properties((SAMPLES, "definitions/samples"))
    with pytest.raises(InvalidInput, match=r"^TableName"):
        deployment.apply("Create", {**properties, "TableName": ""})
    with pytest.raises(InvalidInput, match=r"^Definitions"):
        deployment.apply("Create", {**properties, "Definitions": ["summarize"]})
    with pytest.raises(InvalidInput, match=r"definitions bundle: not a zip"):
        deployment.stack.s3.put_object(
            Bucket=properties["BundleBucket"], Key=properties["BundleKey"], Body=b"not a zip"
        )
        deployment.apply("Create", properties)
    assert deployment.stored() == {}
