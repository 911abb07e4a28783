"""The local moto's cheaper update-expression checks and DynamoDB responses.

agentq/local/moto_expressions.py copies kept trees from templates, walks the checks by
type and checks overlapping paths once per tree; agentq/local/moto_dynamodb.py reads a
response value's members by their own names. Each must answer exactly as moto does
(Hypothesis properties, moto in-process without and with the patches), must actually
take its short way (else it is dead weight), and must be refused when the moto internal
it stands on changes shape.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.core import serialize
from moto.dynamodb.parsing import ast_nodes as untyped_ast_nodes
from moto.dynamodb.parsing import validators
from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]
from moto_support import (  # noqa: F401 (in_process_moto: a fixture)
    assert_answers_as_moto,
    in_process_moto,
    keep_moto_originals,
    moto_client,
)

from agentq.errors import IncompatibleDependency
from agentq.local.moto_server import speed_up_moto

REGION = "eu-west-1"
ast_nodes: Any = untyped_ast_nodes  # moto's AST module is untyped
pytestmark = pytest.mark.usefixtures("in_process_moto")

# The lock's update expression, as agentq sends it (agentq/store/lock.py).
LOCK_UPDATE = (
    "SET #state = :processing, leaseToken = :token, #owner = :worker, effectiveUntil = :eu, "
    "#attempt = if_not_exists(#attempt, :zero) + :one, startedAt = :now, updatedAt = :now, "
    "requestId = if_not_exists(requestId, :rid), envelope = if_not_exists(envelope, :envelope)"
)


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    keep_moto_originals(monkeypatch)
    speed_up_moto()
    yield


def _table(ddb: Any) -> None:
    ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])  # fmt: skip


def _nodes(tree: Any) -> Iterator[Any]:
    yield tree
    for child in tree.children or []:
        if isinstance(child, ast_nodes.Node):
            yield from _nodes(child)


def _shape(tree: Any) -> list[tuple[str, list[Any]]]:
    """Each node's class and its non-node children, in walk order."""
    return [(type(node).__name__,
             [c for c in node.children or [] if not isinstance(c, ast_nodes.Node)])
            for node in _nodes(tree)]  # fmt: skip


# -- a kept tree copied from its template ---------------------------------------------


def _counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    loads, seen = pickle.loads, []

    def counting(data: bytes) -> Any:
        seen.append(data)
        return loads(data)

    monkeypatch.setattr(pickle, "loads", counting)
    return seen


@pytest.mark.usefixtures("patched")
def test_a_kept_tree_is_copied_from_its_template(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = UpdateExpressionParser.make(LOCK_UPDATE)
    unpickled = _counting_loads(monkeypatch)
    copied = validators.deepcopy(kept)
    assert len(unpickled) == 1
    assert _shape(copied) == _shape(copy.deepcopy(kept)) == _shape(kept)
    originals = {id(node) for node in _nodes(kept)}
    assert not any(id(node) in originals for node in _nodes(copied))
    for node in _nodes(copied):  # parents point inside the copy, as deepcopy's do
        for child in node.children or []:
            if isinstance(child, ast_nodes.Node):
                assert child.parent is node


@pytest.mark.usefixtures("patched")
def test_a_tree_that_is_not_kept_is_deep_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = UpdateExpressionParser.make(LOCK_UPDATE)
    being_checked = validators.deepcopy(kept)  # a check may change this one
    unpickled = _counting_loads(monkeypatch)
    again = validators.deepcopy(being_checked)
    assert unpickled == [] and again is not being_checked
    assert _shape(again) == _shape(being_checked)


# -- overlapping paths: answers as moto's, one check per tree -------------------------

_PATHS = ["m", "m.x", "m.x.y", "#m", "#m.x", "l", "l[0]", "l[1]", "a", "#a"]
_overlapping = st.lists(
    st.lists(st.sampled_from(_PATHS), min_size=1, max_size=4).map(
        lambda paths: "SET " + ", ".join(f"{path} = :v" for path in paths)
    ),
    min_size=3, max_size=8,
)  # fmt: skip


def _overlap_answers(expressions: list[str]) -> list[Any]:
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        _table(ddb)
        key = {"PK": {"S": "k"}}
        ddb.put_item(TableName="t", Item={**key, "m": {"M": {"x": {"M": {"y": {"S": "1"}}}}},
                                          "l": {"L": [{"S": "0"}, {"S": "1"}]}})  # fmt: skip
        answers: list[Any] = []
        for expression in expressions:
            names = {k: v for k, v in {"#m": "m", "#a": "a"}.items() if k in expression}
            try:
                answers.append(ddb.update_item(
                    TableName="t", Key=key, UpdateExpression=expression, ReturnValues="ALL_NEW",
                    ExpressionAttributeValues={":v": {"S": "v"}},
                    **({"ExpressionAttributeNames": names} if names else {}),
                )["Attributes"])  # fmt: skip
            except ClientError as exc:
                answers.append((exc.response["Error"]["Code"], exc.response["Error"]["Message"]))
        return answers


@settings(max_examples=40, deadline=None, database=None)
@given(expressions=_overlapping)
def test_overlapping_paths_fail_as_in_moto(expressions: list[str]) -> None:
    assert_answers_as_moto(_overlap_answers, expressions)


def test_a_tree_without_overlaps_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto checks the paths at every node of the tree; patched, a tree whose actions
    pass is checked once, and one that fails goes on to moto's own walk."""
    keep_moto_originals(monkeypatch)
    checks: list[list[str]] = []
    find_path_overlaps = validators.find_path_overlaps

    def counting(paths: list[str]) -> list[str]:
        checks.append(paths)
        return find_path_overlaps(paths)  # type: ignore[no-any-return]

    monkeypatch.setattr(validators, "find_path_overlaps", counting)

    def run(expression: str) -> tuple[list[Any], int]:
        before = len(checks)
        return _overlap_answers([expression]), len(checks) - before

    fine, twice = "SET a = :v, b = :v, c = :v, d = :v", "SET a = :v, m.x = :v, m = :v"
    (plain_fine, plain_fine_checks), (plain_twice, plain_twice_checks) = run(fine), run(twice)
    speed_up_moto()
    (fast_fine, fast_fine_checks), (fast_twice, fast_twice_checks) = run(fine), run(twice)
    assert fast_fine == plain_fine and fast_twice == plain_twice
    assert "overlap" in str(fast_twice)
    assert plain_fine_checks > 1 and fast_fine_checks == 1
    assert fast_twice_checks == 1 + plain_twice_checks


# -- responses: every kind of value, as moto serializes it ----------------------------

_scalar = st.one_of(
    st.builds(lambda s: {"S": s}, st.text(max_size=6)),
    st.builds(lambda n: {"N": str(n)}, st.integers(-(10**6), 10**6)),
    st.builds(lambda b: {"B": b}, st.binary(min_size=1, max_size=6)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda s: {"SS": sorted(s)}, st.sets(st.text(min_size=1, max_size=3), min_size=1, max_size=3)),
    st.builds(lambda s: {"NS": sorted(map(str, s))}, st.sets(st.integers(0, 99), min_size=1, max_size=3)),
    st.builds(lambda s: {"BS": sorted(s)}, st.sets(st.binary(min_size=1, max_size=3), min_size=1, max_size=3)),
)  # fmt: skip
_value = st.recursive(_scalar, lambda inner: st.one_of(
    st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    st.builds(lambda attrs: {"M": attrs}, st.dictionaries(st.text(min_size=1, max_size=3), inner, max_size=3)),
), max_leaves=8)  # fmt: skip
_items = st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]), _value, min_size=1, max_size=3),
                  min_size=1, max_size=3)  # fmt: skip


def _response_answers(items: list[dict[str, Any]]) -> list[Any]:
    """Each item written and read back every way a response carries items; the answers
    as botocore parses them and the bodies as moto sent them."""
    bodies: list[bytes] = []
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        _table(ddb)
        ddb.meta.events.register(
            "after-call.dynamodb.*", lambda http_response, **_: bodies.append(http_response.content)
        )
        answers: list[Any] = []
        for n, item in enumerate(items):
            key = {"PK": {"S": f"k{n}"}}
            answers.append(
                ddb.put_item(TableName="t", Item={**key, **item}, ReturnValues="ALL_OLD")
            )
            answers.append(ddb.get_item(TableName="t", Key=key, ConsistentRead=True))
            answers.append(ddb.update_item(TableName="t", Key=key, ReturnValues="ALL_NEW",
                                           UpdateExpression="SET z = :z",
                                           ExpressionAttributeValues={":z": next(iter(item.values()))}))  # fmt: skip
            answers.append(ddb.query(TableName="t", KeyConditionExpression="PK = :k",
                                     ExpressionAttributeValues={":k": key["PK"]}))  # fmt: skip
        answers.append(ddb.scan(TableName="t"))
        answers.append(ddb.transact_get_items(TransactItems=[
            {"Get": {"TableName": "t", "Key": {"PK": {"S": f"k{n}"}}}} for n in range(len(items))]))  # fmt: skip
        for answer in answers:
            answer.pop("ResponseMetadata", None)
        return [answers, bodies]


@settings(max_examples=40, deadline=None, database=None)
@given(items=_items)
def test_responses_carry_every_kind_of_value_as_moto_does(items: list[dict[str, Any]]) -> None:
    assert_answers_as_moto(_response_answers, items)


def test_a_value_is_read_by_its_own_members(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patched, moto's picker is never asked for a member of a DynamoDB value."""
    keep_moto_originals(monkeypatch)
    asked: list[str] = []
    pick = serialize.XFormedAttributePicker.__call__

    def counting(self: Any, context: Any) -> Any:
        if (
            getattr(context.shape, "parent", None) is not None
            and context.shape.parent.name == "AttributeValue"
        ):
            asked.append(context.key)
        return pick(self, context)

    monkeypatch.setattr(serialize.XFormedAttributePicker, "__call__", counting)
    item = [{"a": {"M": {"x": {"L": [{"S": "s"}, {"N": "1"}]}}}}]
    _response_answers(item)
    plain = len(asked)
    speed_up_moto()
    _response_answers(item)
    assert plain >= 10 and len(asked) == plain  # the patched run asked nothing


# -- refused when moto changes shape --------------------------------------------------


def _refused(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, replacement: Any) -> str:
    keep_moto_originals(monkeypatch)
    monkeypatch.setattr(target, name, replacement, raising=False)
    with pytest.raises(IncompatibleDependency) as refusal:
        speed_up_moto()
    assert not hasattr(ast_nodes.DepthFirstTraverser.traverse_node_recursively, "by_type")
    return str(refusal.value)


def test_a_walk_without_the_pre_child_hook_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
        for i, child_node in enumerate(getattr(node, "children", None) or []):
            self.traverse_node_recursively(child_node, i)
        return node

    message = _refused(monkeypatch, ast_nodes.DepthFirstTraverser, "traverse_node_recursively",
                       traverse_node_recursively)  # fmt: skip
    assert "agentq/local/moto_expressions.py" in message and "traverse_node_recursively" in message


def test_an_overlap_check_reading_more_than_the_actions_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def check_for_overlapping_paths(self: Any, node: Any) -> Any:
        if node.parent is None:  # reads the node itself: a stand-in would answer otherwise
            node.find_clauses([ast_nodes.UpdateExpressionSetAction])
        return node

    assert "more than the actions" in _refused(
        monkeypatch, validators.OverlappingPathsValidator, "check_for_overlapping_paths",
        check_for_overlapping_paths)  # fmt: skip


def test_a_node_that_copies_itself_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def __deepcopy__(self: Any, memo: Any) -> Any:  # noqa: N807
        return self

    message = _refused(monkeypatch, ast_nodes.UpdateExpressionPath, "__deepcopy__", __deepcopy__)
    assert "customises its copies" in message


def test_validators_that_copy_another_way_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "copy.deepcopy" in _refused(monkeypatch, validators, "deepcopy", copy.copy)


def test_a_value_member_looked_up_by_another_name_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class SameAsString(serialize.NoAlias):
        def get_alias(self, key: str) -> str:
            return "S"  # every member found under S: the patch would read others

    providers = [SameAsString, *serialize.DEFAULT_ALIAS_PROVIDERS]
    message = _refused(monkeypatch, serialize, "DEFAULT_ALIAS_PROVIDERS", providers)
    assert "agentq/local/moto_dynamodb.py" in message and "AttributeValue." in message


def test_patching_twice_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    keep_moto_originals(monkeypatch)
    speed_up_moto()
    traverser, json = ast_nodes.DepthFirstTraverser, serialize.JSONSerializer
    first = (validators.deepcopy, traverser.traverse_node_recursively, traverser.process,
             validators.OverlappingPathsValidator.traverse, json._serialize_type_structure)  # fmt: skip
    speed_up_moto()  # a second start-up in the same process finds its own patches
    assert first == (validators.deepcopy, traverser.traverse_node_recursively, traverser.process,
                     validators.OverlappingPathsValidator.traverse, json._serialize_type_structure)  # fmt: skip
    assert _overlap_answers(["SET a = :v, m.x = :v"])[0] == {"PK": {"S": "k"}, "a": {"S": "v"},
        "m": {"M": {"x": {"S": "v"}}}, "l": {"L": [{"S": "0"}, {"S": "1"}]}}  # fmt: skip
