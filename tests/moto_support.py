"""What the local moto launcher's patches replace, put back after a test; and moto
in-process, not the local server a test run may point at."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import jsonpath_ng.ext
import moto.dynamodb.models as dynamodb_models
import moto.sqs.models as sqs_models
import pytest
from moto.core import responses as moto_responses
from moto.core import serialize
from moto.dynamodb.comparisons import ConditionExpressionParser
from moto.dynamodb.models import table as table_module
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.models.table import Table
from moto.dynamodb.parsing import ast_nodes as untyped_ast_nodes
from moto.dynamodb.parsing import validators
from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]

ast_nodes: Any = untyped_ast_nodes  # moto's AST module is untyped


def keep_moto_originals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything speed_up_moto patches, put back when `monkeypatch` undoes."""
    monkeypatch.setattr(jsonpath_ng.ext, "parse", jsonpath_ng.ext.parse)
    names = "method_names_from_class"
    monkeypatch.setattr(moto_responses, names, getattr(moto_responses, names))
    for name in ("unix_time", "unix_time_millis"):
        monkeypatch.setattr(sqs_models, name, getattr(sqs_models, name))
    retention = "is_message_valid_based_on_retention_period"
    monkeypatch.setattr(sqs_models.SQSBackend, retention,
                        getattr(sqs_models.SQSBackend, retention))  # fmt: skip
    monkeypatch.setattr(dynamodb_models, "copy", dynamodb_models.copy)
    monkeypatch.setattr(table_module, "copy", table_module.copy)
    monkeypatch.setattr(Item, "size", Item.size)
    backend = dynamodb_models.DynamoDBBackend
    monkeypatch.setattr(backend, "transact_write_items", backend.transact_write_items)
    for name in ("query", "all_items", "sorted_items", "put_item", "delete_item"):
        monkeypatch.setattr(Table, name, getattr(Table, name))
    monkeypatch.setattr(backend, "update_item", backend.update_item)
    traverser = ast_nodes.DepthFirstTraverser
    for name in ("nodes_to_be_processed", "traverse_node_recursively", "process"):
        monkeypatch.setattr(traverser, name, getattr(traverser, name))
    monkeypatch.setattr(validators, "deepcopy", validators.deepcopy)
    json = serialize.get_serializer_class("dynamodb", "json")
    monkeypatch.setattr(json, "_serialize_type_structure", json._serialize_type_structure)
    overlaps = validators.OverlappingPathsValidator
    monkeypatch.setattr(overlaps, "traverse", overlaps.traverse)
    counting = validators.ActionCountValidator
    for name in ("verify_action_counts", "traverse"):
        monkeypatch.setattr(counting, name, getattr(counting, name))
    # The class's own entry (a classmethod), not the method bound from it.
    monkeypatch.setattr(UpdateExpressionParser, "make", UpdateExpressionParser.__dict__["make"])
    lexer = "_lex_condition_expression"
    monkeypatch.setattr(ConditionExpressionParser, lexer, getattr(ConditionExpressionParser, lexer))


def patch_as_the_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's moto patched as the local server's (speed_up_moto: the same
    answers, less CPU), until `monkeypatch` undoes."""
    from agentq.local.moto_server import speed_up_moto

    keep_moto_originals(monkeypatch)
    speed_up_moto()


@pytest.fixture
def in_process_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`mock_aws` answers, with test credentials, whatever endpoint the run set."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    yield


def assert_answers_as_moto(answers: Callable[[Any], Any], case: Any) -> None:
    """`answers(case)` the same without and with the launcher's patches."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        plain = answers(case)
        patch_as_the_local_server(monkeypatch)
        assert answers(case) == plain


@functools.cache
def _session() -> boto3.Session:
    return boto3.Session()


def moto_client(service: str, region_name: str) -> Any:
    """A client for in-process moto from one shared session: botocore loads its service
    and endpoint models once, not for each of a property's examples (0.45 of the 0.7 s
    an example took)."""
    return _session().client(service, region_name=region_name)  # type: ignore[call-overload]
