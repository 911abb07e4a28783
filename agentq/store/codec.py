"""Python values ⇄ DynamoDB attribute values (floats travel as Decimal).

boto3's (de)serializers are built on first use: importing `boto3.dynamodb.types` runs
boto3's package import (botocore, urllib3; ≈150 ms), which a Lambda handler or a task
child importing the store should not pay before it touches DynamoDB.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boto3.dynamodb.types import TypeDeserializer, TypeSerializer


@functools.cache
def _serializer() -> TypeSerializer:
    from boto3.dynamodb.types import TypeSerializer

    return TypeSerializer()


@functools.cache
def _deserializer() -> TypeDeserializer:
    from boto3.dynamodb.types import TypeDeserializer

    return TypeDeserializer()


def _to_dynamo(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, Mapping):
        return {str(k): _to_dynamo(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    if isinstance(value, set):
        return {_from_dynamo(v) for v in value}
    return value


def serialize(value: Any) -> dict[str, Any]:
    result: dict[str, Any] = _serializer().serialize(_to_dynamo(value))
    return result


def to_item(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: serialize(v) for k, v in values.items() if v is not None}


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _from_dynamo(_deserializer().deserialize(v)) for k, v in item.items()}


def values(**named: Any) -> dict[str, Any]:
    """ExpressionAttributeValues from keyword arguments (`:name` placeholders)."""
    return {f":{k}": serialize(v) for k, v in named.items()}
