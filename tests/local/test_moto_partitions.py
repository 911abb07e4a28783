"""moto's index queries read one index partition, a page its window of it
(agentq/local/moto_partitions.py), and answer as moto does: a Hypothesis property runs
generated writes and queries against moto in-process without and with the patch (its
windows one item wide to start, so that pages widen them), alone and beside the index
lag rule, and compares every answer; a moto that changes items elsewhere is refused.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import moto.dynamodb.models as dynamodb_models
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.dynamodb.models import table as table_module
from moto.dynamodb.models.table import Table
from moto_support import (  # noqa: F401 (in_process_moto: a fixture)
    in_process_moto,
    keep_moto_originals,
    moto_client,
)

from agentq.errors import IncompatibleDependency
from agentq.local import moto_guards, moto_partitions
from agentq.local.moto_server import speed_up_moto
from agentq.local.rules import dynamodb_index_lag

REGION = "eu-west-1"
pytestmark = pytest.mark.usefixtures("in_process_moto")

Op = tuple[Any, ...]

# -- generated cases --------------------------------------------------------------------

# Few keys and partitions, so writes meet the items and partitions queries read.
_pk = st.sampled_from(["a", "b", "c"])
_sk = st.sampled_from(["1", "10"])
_g = st.sampled_from([None, "g0", "g1", "odd"])  # "odd": a list, no index key value
_r = st.one_of(st.none(), st.integers(0, 5))
_n = st.integers(0, 9)
_table = st.sampled_from(["t", "h"])  # "h": a table without a range key

_put = st.tuples(st.just("put"), _table, _pk, _sk, _g, _r, _n)
_update = st.tuples(
    st.just("update"), _table, _pk, _sk,
    st.sampled_from(["SET G = :g", "SET G = :g", "REMOVE G", "SET R = :r", "REMOVE R",
                     "SET n = :n", "SET G = :g, R = :r"]),
    st.sampled_from(["g0", "g1"]), st.integers(0, 5), _n,
)  # fmt: skip
_delete = st.tuples(st.just("delete"), _table, _pk, _sk)
_write = st.one_of(_put, _update, _delete)
_transact = st.tuples(st.just("transact"), st.lists(_write, min_size=1, max_size=3),
                      st.sampled_from([False, False, True]))  # fmt: skip
_batch = st.tuples(st.just("batch"), st.lists(st.one_of(_put, _delete), min_size=1, max_size=4))
_range = st.sampled_from([None, "R = :a", "R < :a", "R <= :b", "R > :a", "R >= :a",
                          "R BETWEEN :a AND :b"])  # fmt: skip
_sk_range = st.sampled_from([None, "begins_with(SK, :p)", "SK BETWEEN :p AND :q", "SK > :p"])
_query = st.one_of(
    st.tuples(st.just("query"), _table, st.just("by-g"), st.sampled_from(["g0", "g1"]),
              _range, st.booleans(), st.sampled_from([None, 1, 2, 3, 50]),
              st.sampled_from([None, "n > :n", "attribute_exists(R)"]),
              st.sampled_from([None, "PK, n"])),
    st.tuples(st.just("query"), st.just("t"), st.sampled_from(["by-g-sk", "by-g-keys"]),
              st.sampled_from(["g0", "g1"]), _sk_range, st.booleans(),
              st.sampled_from([None, 1, 2, 4]), st.sampled_from([None, "n > :n"]),
              st.just(None)),
)  # fmt: skip
_tick = st.tuples(st.just("tick"), st.sampled_from([0, 400, 1_200]))
_cases = st.lists(
    st.one_of(_put, _update, _update, _delete, _transact, _batch, _query, _query, _tick),
    min_size=6, max_size=40,
)  # fmt: skip
# Every key of both tables written first, spread over the partitions, and each index
# read once (the patch files an index at its first query), so that the generated writes
# meet items and index partitions already filed.
_SEED: list[Op] = [
    *(("put", table, pk, sk, ["g0", "g1", None, "odd"][i % 4] if i % 5 else "g0", i % 6, i)
      for i, (table, pk, sk) in enumerate((table, pk, sk) for table in ("t", "h")
                                          for pk in ("a", "b", "c") for sk in ("1", "10"))),
    *(("query", table, index, "g0", None, True, None, None, None)
      for table, index in (("t", "by-g"), ("t", "by-g-sk"), ("t", "by-g-keys"), ("h", "by-g"))),
]  # fmt: skip


# -- running a case ---------------------------------------------------------------------


def _create_tables(ddb: Any) -> None:
    attrs = [{"AttributeName": a, "AttributeType": t}
             for a, t in (("PK", "S"), ("SK", "S"), ("G", "S"), ("R", "N"))]  # fmt: skip

    def index(name: str, keys: list[tuple[str, str]], projection: dict[str, Any]) -> Any:
        return {"IndexName": name, "Projection": projection,
                "KeySchema": [{"AttributeName": a, "KeyType": k} for a, k in keys]}  # fmt: skip

    ddb.create_table(
        TableName="t", BillingMode="PAY_PER_REQUEST", AttributeDefinitions=attrs,
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                   {"AttributeName": "SK", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            index("by-g", [("G", "HASH"), ("R", "RANGE")], {"ProjectionType": "ALL"}),
            index("by-g-sk", [("G", "HASH"), ("SK", "RANGE")],
                  {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["n"]}),
            index("by-g-keys", [("G", "HASH")], {"ProjectionType": "KEYS_ONLY"}),
        ],
    )  # fmt: skip
    ddb.create_table(
        TableName="h", BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[a for a in attrs if a["AttributeName"] != "SK"],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            index("by-g", [("G", "HASH"), ("R", "RANGE")], {"ProjectionType": "ALL"})
        ],
    )  # fmt: skip


def _key(table: str, pk: str, sk: str) -> dict[str, Any]:
    return {"PK": {"S": pk}} | ({"SK": {"S": sk}} if table == "t" else {})


def _item(op: Op) -> dict[str, Any]:
    _, table, pk, sk, g, r, n = op
    item = _key(table, pk, sk) | {"n": {"N": str(n)}}
    if g == "odd":
        item["G"] = {"L": [{"S": "g0"}]}
    elif g is not None:
        item["G"] = {"S": g}
    if r is not None:
        item["R"] = {"N": str(r)}
    return item


def _update_args(op: Op) -> dict[str, Any]:
    _, table, pk, sk, expression, g, r, n = op
    values = {":g": {"S": g}, ":r": {"N": str(r)}, ":n": {"N": str(n)}}
    used = {k: v for k, v in values.items() if k in expression}
    return {"TableName": table, "Key": _key(table, pk, sk), "UpdateExpression": expression,
            **({"ExpressionAttributeValues": used} if used else {})}  # fmt: skip


def _transact_entry(op: Op) -> dict[str, Any]:
    if op[0] == "put":
        return {"Put": {"TableName": op[1], "Item": _item(op)}}
    if op[0] == "update":
        return {"Update": _update_args(op)}
    return {"Delete": {"TableName": op[1], "Key": _key(op[1], op[2], op[3])}}


def _pages(ddb: Any, op: Op) -> list[Any]:
    _, table, index, g, condition, forward, limit, filtering, projection = op
    values: dict[str, Any] = {":g": {"S": g}, ":a": {"N": "2"}, ":b": {"N": "4"},
                              ":p": {"S": "1"}, ":q": {"S": "2"}, ":n": {"N": "4"}}  # fmt: skip
    expression = "G = :g" + (f" AND {condition}" if condition else "")
    query: dict[str, Any] = {"TableName": table, "IndexName": index,
                             "KeyConditionExpression": expression, "ScanIndexForward": forward}  # fmt: skip
    if limit:
        query["Limit"] = limit
    if filtering:
        query["FilterExpression"] = filtering
    if projection:
        query["ProjectionExpression"] = projection
    text = " ".join(str(query.get(k, "")) for k in ("KeyConditionExpression", "FilterExpression"))
    query["ExpressionAttributeValues"] = {k: v for k, v in values.items() if k in text}
    found: list[Any] = []
    for _page in range(40):
        try:
            page = ddb.query(**query)
        except ClientError as exc:
            return [*found, exc.response["Error"]["Code"]]
        found.append((page["Items"], page["Count"], page["ScannedCount"]))
        if "LastEvaluatedKey" not in page:
            break
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return found


def _answers(case: list[Op], clock: list[float]) -> list[Any]:
    """Each operation of the case in turn: its answer, or its error's code."""
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        _create_tables(ddb)
        answers: list[Any] = []
        for op in _SEED + case:
            try:
                if op[0] == "put":
                    ddb.put_item(TableName=op[1], Item=_item(op))
                elif op[0] == "update":
                    ddb.update_item(**_update_args(op))
                elif op[0] == "delete":
                    ddb.delete_item(TableName=op[1], Key=_key(op[1], op[2], op[3]))
                elif op[0] == "transact":
                    entries = [_transact_entry(w) for w in op[1]]
                    if op[2]:  # a condition that fails: moto rolls the others back
                        entries.append({"ConditionCheck": {
                            "TableName": "t", "Key": _key("t", "z", "z"),
                            "ConditionExpression": "attribute_exists(PK)"}})  # fmt: skip
                    ddb.transact_write_items(TransactItems=entries)
                elif op[0] == "batch":
                    requests: dict[str, list[Any]] = {}
                    for w in op[1]:
                        request = ({"PutRequest": {"Item": _item(w)}} if w[0] == "put" else
                                   {"DeleteRequest": {"Key": _key(w[1], w[2], w[3])}})  # fmt: skip
                        requests.setdefault(w[1], []).append(request)
                    ddb.batch_write_item(RequestItems=requests)
                elif op[0] == "tick":
                    clock[0] += op[1] / 1000
                    continue
                else:
                    answers.append(_pages(ddb, op))
                    continue
                answers.append("ok")
            except ClientError as exc:
                answers.append(exc.response["Error"]["Code"])
        return answers


def _run(case: list[Op], *, patched: bool, lag_ms: int) -> list[Any]:
    """The case's answers from moto as the local server runs it: patched or not, with
    the index lag rule (on a clock the case moves) or without."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        keep_moto_originals(monkeypatch)
        backend = dynamodb_models.DynamoDBBackend
        for name in ("put_item", "update_item", "delete_item", "query", "scan"):
            monkeypatch.setattr(backend, name, getattr(backend, name))
        clock = [1_000.0]
        monkeypatch.setattr(dynamodb_index_lag, "time", SimpleNamespace(monotonic=lambda: clock[0]))
        monkeypatch.setattr(dynamodb_index_lag, "_history", {})
        monkeypatch.setenv(dynamodb_index_lag.VARIABLE, str(lag_ms))
        if patched:
            monkeypatch.setattr(moto_partitions, "_WIDTH", 1)  # every page widens its window
            speed_up_moto()
        dynamodb_index_lag.install()  # as the server does: after the speed-ups
        return _answers(case, clock)


@settings(max_examples=60, deadline=None, database=None)
@given(case=_cases)
def test_index_queries_answer_as_moto_does(case: list[Op]) -> None:
    assert _run(case, patched=True, lag_ms=0) == _run(case, patched=False, lag_ms=0)


@settings(max_examples=40, deadline=None, database=None)
@given(case=_cases)
def test_index_queries_answer_as_moto_does_beside_the_index_lag(case: list[Op]) -> None:
    """The lag rule swaps recent writes' earlier items into the table for an index read:
    the partitions see the swap, and the table as it is after it."""
    assert _run(case, patched=True, lag_ms=1_000) == _run(case, patched=False, lag_ms=1_000)


def test_an_item_moved_between_partitions_and_deleted_is_found_where_it_is() -> None:
    """A partition read before and after writes that move, update and delete its items."""
    case: list[Op] = [
        ("put", "t", "a", "1", "g2", 3, 1), ("put", "t", "b", "2", "g2", 1, 2),
        ("query", "t", "by-g", "g2", None, True, None, None, None),
        ("update", "t", "a", "1", "SET G = :g", "g3", 0, 0),
        ("query", "t", "by-g", "g2", None, True, None, None, None),
        ("query", "t", "by-g", "g3", None, False, 1, None, None),
        ("delete", "t", "b", "2"), ("put", "t", "c", "3", "g2", 0, 5),
        ("query", "t", "by-g", "g2", "R BETWEEN :a AND :b", True, 1, None, None),
        ("query", "t", "by-g", "g2", None, True, 1, None, None),
    ]  # fmt: skip
    answers = _run(case, patched=True, lag_ms=0)
    assert answers == _run(case, patched=False, lag_ms=0)
    answers = answers[len(_SEED) :]
    first, moved_out, moved_in, last = answers[2], answers[4], answers[5], answers[-1]
    assert [[i["PK"]["S"] for i in page[0]] for page in first] == [["b", "a"]]
    assert [[i["PK"]["S"] for i in page[0]] for page in moved_out] == [["b"]]
    assert [[i["PK"]["S"] for i in page[0]] for page in moved_in] == [["a"]]
    assert [[i["PK"]["S"] for i in page[0]] for page in last] == [["c"]]


def test_a_page_reads_its_window_of_the_partition_not_all_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paging a partition of 600 items 10 at a time, both ways: moto tests a handful of
    items against each start key (a bisection), not every item before it."""
    keep_moto_originals(monkeypatch)
    speed_up_moto()
    tested = [0]
    comes_before = Table._item_comes_before_dct

    def counted(self: Any, *args: Any) -> bool:
        tested[0] += 1
        return bool(comes_before(self, *args))

    monkeypatch.setattr(Table, "_item_comes_before_dct", counted)
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        _create_tables(ddb)
        for n in range(600):
            ddb.put_item(TableName="t", Item=_item(("put", "t", f"p{n:03d}", "1", "g0", n % 7, n)))
        for forward in (True, False):
            op = ("query", "t", "by-g", "g0", None, forward, 10, None, None)
            pages = _pages(ddb, op)
            assert len(pages) == 40  # _pages stops at 40: 400 of the 600 items
            names = [i["PK"]["S"] for page in pages for i in page[0]]
            keys = sorted((n % 7, f"p{n:03d}") for n in range(600))
            assert names == [pk for _, pk in (keys if forward else keys[::-1])][:400]
    assert tested[0] <= 2 * 39 * 12  # 39 start keys a direction, log2(600) + 2 tests each


# -- a moto that changes items elsewhere is refused -------------------------------------


def _refused(monkeypatch: pytest.MonkeyPatch) -> str:
    keep_moto_originals(monkeypatch)
    with pytest.raises(IncompatibleDependency) as refused:
        speed_up_moto()
    message = str(refused.value)
    assert "agentq/local/moto_partitions.py" in message and "patches it" in message
    return message


def test_a_table_that_writes_its_items_elsewhere_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = moto_guards.source_of

    def source_of(found: Any) -> str:
        # A moto whose Table puts items back by a method of its own.
        restore = "\n    def restore(self, other):\n        self.items[other.hash_key] = other\n"
        return read(found) + (restore if found is Table else "")

    monkeypatch.setattr(moto_guards, "source_of", source_of)
    assert "outside put/delete_item" in _refused(monkeypatch)


def test_a_sort_that_no_longer_ends_with_the_table_key_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def sorted_items(self: Any, hash_key_attrs: Any, range_key_attrs: Any, items: Any) -> Any:
        items.sort(key=lambda x: x.attrs[hash_key_attrs[0]])  # ties kept in input order
        return items

    monkeypatch.setattr(Table, "sorted_items", sorted_items)
    assert "sorts another way" in _refused(monkeypatch)


def test_an_update_elsewhere_in_place_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = dynamodb_models.DynamoDBBackend

    def update_item(self: Any, table_name: str, key: Any, *args: Any, **kwargs: Any) -> Any:
        return self.get_table(table_name).get_item(key)  # updates nothing here

    monkeypatch.setattr(backend, "update_item", update_item)
    assert "in place outside update_item" in _refused(monkeypatch)


def test_a_page_that_skips_to_its_start_another_way_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def comes_before(self: Any, item: Any, dct: Any, hash_attrs: Any, range_attrs: Any,
                     forward: bool) -> bool:  # fmt: skip
        return bool(item.hash_key < dynamodb_models.DynamoType(dct[self.hash_key_attr]))

    monkeypatch.setattr(Table, "_item_comes_before_dct", comes_before)
    assert "pages an index query another way" in _refused(monkeypatch)


def test_a_table_module_with_a_copy_of_its_own_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's query would deep-copy its page with something the patch does not replace."""
    monkeypatch.setattr(table_module, "copy", SimpleNamespace(deepcopy=lambda value: value))
    assert "copies or reads its page's items another way" in _refused(monkeypatch)


def test_an_item_sized_by_more_than_its_attributes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The patch remembers an item's size while the partition is unchanged."""

    def size(self: Any) -> int:
        return len(self.attrs) + len(str(self.hash_key))

    monkeypatch.setattr(dynamodb_models.Item, "size", size)
    assert "sizes its page's items another way" in _refused(monkeypatch)
