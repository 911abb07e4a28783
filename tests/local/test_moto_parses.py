"""The local moto's kept parses: the same answers as moto's, whatever the values.

agentq's local moto keeps a parsed update expression and a lexed condition expression by
their text (agentq/local/moto_dynamodb.py). The values differ from request to request,
so each property sends the same few texts with other values and names, valid and not,
and compares every answer with moto's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.dynamodb.parsing import validators
from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]
from moto_support import in_process_moto, keep_moto_originals, moto_client  # noqa: F401 (a fixture)

from agentq.errors import IncompatibleDependency
from agentq.local.moto_server import speed_up_moto

pytestmark = pytest.mark.usefixtures("in_process_moto")


_CONDITIONS = [
    "#s = :a", "#s IN (:a, :b)", "attribute_not_exists(PK) OR #s = :a",
    "(#s = :a AND n < :n) OR attribute_not_exists(z)", "n BETWEEN :n AND :m",
    "NOT contains(#s, :a)", "size(#s) > :n", "begins_with(#s, :a) AND n <> :n",
    "#s = :a AND", "n < :missing",  # refused: a dangling AND, an undefined value
]  # fmt: skip
_UPDATES = ["SET #s = :a, n = n + :n", "SET n = if_not_exists(n, :m) + :n REMOVE z",
            "SET #s = :b ADD n :n", "SET n = :n, n = :m"]  # fmt: skip
_names = st.sampled_from(["state", "other", "n"])
_strings = st.sampled_from(["PENDING", "RUNNING", "P", ""])
_step = st.tuples(st.sampled_from(_UPDATES), st.sampled_from(_CONDITIONS), _names,
                  _strings, _strings, st.integers(-3, 3), st.integers(-3, 3))  # fmt: skip


def _answers(steps: list[tuple[str, str, str, str, str, int, int]]) -> list[Any]:
    with mock_aws():
        ddb = moto_client("dynamodb", region_name="eu-west-1")
        ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])  # fmt: skip
        key = {"PK": {"S": "k"}}
        answers: list[Any] = []
        for update, condition, name, a, b, n, m in steps:
            values = {":a": {"S": a}, ":b": {"S": b}, ":n": {"N": str(n)}, ":m": {"N": str(m)}}
            used = {k: v for k, v in values.items() if k in update or k in condition}
            request: dict[str, Any] = {
                "TableName": "t", "Key": key, "UpdateExpression": update,
                "ConditionExpression": condition, "ExpressionAttributeNames": {"#s": name},
                "ExpressionAttributeValues": used, "ReturnValues": "ALL_NEW",
            }  # fmt: skip
            for write in (ddb.update_item, _in_a_transaction(ddb)):
                try:
                    answers.append(write(**request).get("Attributes"))
                except ClientError as exc:
                    error = exc.response["Error"]
                    answers.append((error["Code"], error["Message"],
                                    exc.response.get("CancellationReasons")))  # fmt: skip
                except (ValueError, KeyError) as exc:  # moto itself fails on some refusals
                    answers.append((type(exc).__name__, str(exc)))
        return answers


def _in_a_transaction(ddb: Any) -> Callable[..., dict[str, Any]]:
    def write(**request: Any) -> dict[str, Any]:
        request.pop("ReturnValues")
        return ddb.transact_write_items(TransactItems=[{"Update": request}])  # type: ignore[no-any-return]

    return write


@settings(max_examples=30, deadline=None, database=None)
@given(steps=st.lists(_step, min_size=4, max_size=10))
def test_kept_parses_answer_as_moto_does(steps: list[Any]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        keep_moto_originals(monkeypatch)
        plain, plain_reversed = _answers(steps), _answers(steps[::-1])
        speed_up_moto()
        assert _answers(steps) == plain
        # Again with every parse already kept, in another order.
        assert _answers(steps[::-1]) == plain_reversed


def test_a_parse_failure_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_moto_originals(monkeypatch)
    speed_up_moto()
    with pytest.raises(Exception) as first:
        UpdateExpressionParser.make("SET a = ")
    with pytest.raises(type(first.value)):
        UpdateExpressionParser.make("SET a = ")
    assert UpdateExpressionParser.make("SET a = :v") is UpdateExpressionParser.make("SET a = :v")


def test_a_validator_that_no_longer_copies_its_tree_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keep_moto_originals(monkeypatch)

    def __init__(self: Any, expression: Any, *args: Any) -> None:  # noqa: N807
        self.node_to_validate = expression  # validates the kept tree itself: unsafe

    monkeypatch.setattr(validators.Validator, "__init__", __init__)
    with pytest.raises(IncompatibleDependency, match="no longer copies the tree"):
        speed_up_moto()
    assert not hasattr(UpdateExpressionParser.make, "remembered")  # nothing patched


def test_a_changed_update_parser_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_moto_originals(monkeypatch)
    monkeypatch.setattr(UpdateExpressionParser, "make",
                        classmethod(lambda cls, text, strict=True: None))  # fmt: skip
    with pytest.raises(IncompatibleDependency, match=r"make\(expression_str\) changed"):
        speed_up_moto()
