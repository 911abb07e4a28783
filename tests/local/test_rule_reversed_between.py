"""DynamoDB refuses a key condition `BETWEEN a AND b` with a above b; moto alone answers
it with no items. The local server answers as AWS does (rules/dynamodb_reversed_between)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from support import settle_indexes

from agentq.errors import IncompatibleDependency
from agentq.local.rules import dynamodb_reversed_between
from agentq.store.codec import values


def _events_of(stack: Stack, type_pk: str, sort_keys: list[str]) -> None:
    for sort_key in sort_keys:
        stack.dynamodb.put_item(TableName=stack.resources.table_name, Item={
            "PK": {"S": f"BETWEEN#{uuid.uuid4().hex}"}, "SK": {"S": "EVENT"},
            "typePK": {"S": type_pk}, "typeSK": {"S": sort_key},
        })  # fmt: skip


def _by_type(stack: Stack, type_pk: str, lo: str, hi: str, **query: Any) -> list[str]:
    found = stack.dynamodb.query(
        TableName=stack.resources.table_name, IndexName="byType",
        KeyConditionExpression="typePK = :pk AND typeSK BETWEEN :lo AND :hi",
        ExpressionAttributeValues=values(pk=type_pk, lo=lo, hi=hi), **query,
    )  # fmt: skip
    return sorted(item["typeSK"]["S"] for item in found.get("Items", []))


def test_a_reversed_between_is_a_validation_exception_on_tables_and_indexes(
    stack: Stack,
) -> None:
    type_pk = f"BETWEEN#{uuid.uuid4().hex[:8]}"
    _events_of(stack, type_pk, ["a", "b", "c"])
    settle_indexes(stack)
    assert _by_type(stack, type_pk, "a", "b") == ["a", "b"]
    assert _by_type(stack, type_pk, "b", "b") == ["b"], "equal bounds are a valid range"

    with pytest.raises(ClientError) as on_index:
        _by_type(stack, type_pk, "c", "a")
    assert on_index.value.response["Error"]["Code"] == "ValidationException"
    assert "BETWEEN operator requires upper bound" in str(on_index.value)
    assert "{S:c}" in str(on_index.value)

    with pytest.raises(ClientError) as on_table:
        stack.dynamodb.query(
            TableName=stack.resources.table_name,
            KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(pk="BETWEEN#x", lo="z", hi="a"),
        )
    assert on_table.value.response["Error"]["Code"] == "ValidationException"


def test_between_bounds_compare_as_dynamodb_orders_them() -> None:
    reversed_pair = dynamodb_reversed_between._reversed
    assert reversed_pair("BETWEEN", [{"N": "10"}, {"N": "9"}])
    assert not reversed_pair("BETWEEN", [{"N": "9"}, {"N": "10"}]), "numbers by value"
    assert not reversed_pair("between", [{"S": "Z"}, {"S": "a"}]), "strings by their bytes"
    assert reversed_pair("BETWEEN", [{"B": "/w=="}, {"B": "AA=="}]), "binaries by bytes"
    assert not reversed_pair("BETWEEN", [{"S": "b"}, {"N": "1"}]), "moto answers mismatches"
    assert not reversed_pair(">", [{"S": "b"}])


def test_the_rule_refuses_a_moto_whose_query_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.dynamodb.models as dynamodb_models

    def query(self: object, table_name: str, key: object) -> None:
        raise AssertionError("never called")

    monkeypatch.setattr(dynamodb_models.DynamoDBBackend, "query", query)
    with pytest.raises(IncompatibleDependency, match="query"):
        dynamodb_reversed_between.install()
