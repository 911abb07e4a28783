"""Each moto patch: refused when its target changed shape, and invisible in moto's answers.

For every patch, representative calls run against moto in-process twice, without and
with the patch, and the answers must be equal (for update expressions, a Hypothesis
property over generated expressions, invalid ones included); and a target reshaped the
way an upgrade could reshape it makes the launcher refuse, naming the package and
version.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

import jsonpath_ng.ext
import moto.dynamodb.models as dynamodb_models
import moto.sqs.models as sqs_models
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.core import responses as moto_responses
from moto.dynamodb.models.table import Table
from moto.dynamodb.parsing import ast_nodes as untyped_ast_nodes
from moto.dynamodb.parsing import validators
from moto.moto_server import werkzeug_app
from moto.moto_server.werkzeug_app import create_backend_app
from moto_support import (  # noqa: F401 (in_process_moto: a fixture)
    assert_answers_as_moto,
    in_process_moto,
    keep_moto_originals,
    moto_client,
)

from agentq.errors import IncompatibleDependency
from agentq.local.moto_server import _dispatcher, speed_up_moto

REGION = "eu-west-1"
MOTO = f"moto {metadata.version('moto')}"
ast_nodes: Any = untyped_ast_nodes  # moto's AST module is untyped


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Patch moto for one test; monkeypatch puts every original back afterwards."""
    keep_moto_originals(monkeypatch)
    return speed_up_moto


pytestmark = pytest.mark.usefixtures("in_process_moto")


# -- answers without and with each patch ---------------------------------------------------


def _sqs_answers() -> list[Any]:
    """Send, delay, receive, hide and receive again: what a worker's queue sees."""
    with mock_aws():
        sqs = moto_client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
        for body in ("a", "b"):
            sqs.send_message(QueueUrl=url, MessageBody=body)
        sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=900)
        first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                    AttributeNames=["ApproximateReceiveCount"])  # fmt: skip
        messages = first["Messages"]
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"], VisibilityTimeout=0
        )
        again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                    AttributeNames=["ApproximateReceiveCount"])  # fmt: skip
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        # Past the queue's retention a message is not returned (moto checks it per message).
        short = sqs.create_queue(QueueName="short", Attributes={"MessageRetentionPeriod": "60"})
        for body in ("old", "young"):
            sqs.send_message(QueueUrl=short["QueueUrl"], MessageBody=body)
        backend = sqs_models.sqs_backends["123456789012"][REGION]
        old: Any = backend.queues["short"]._messages[0]
        old.sent_timestamp -= 120_000  # sent two minutes ago: past the retention
        kept = sqs.receive_message(QueueUrl=short["QueueUrl"], MaxNumberOfMessages=10)
        return [
            sorted((m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in messages),
            [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again["Messages"]],
            {k: counts[k] for k in counts if k.startswith("ApproximateNumberOfMessages")},
            [m["Body"] for m in kept.get("Messages", [])],
        ]


def _dynamodb_answers() -> list[Any]:
    """A transaction that commits, then one whose last condition fails and rolls back."""
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])  # fmt: skip
        keys = [{"PK": {"S": f"c{i}"}} for i in range(4)]
        for key in keys:
            ddb.put_item(TableName="t", Item={**key, "n": {"N": "0"}})

        def bump(key: dict[str, Any], expected: int) -> dict[str, Any]:
            return {"Update": {"TableName": "t", "Key": key, "UpdateExpression": "SET n = n + :one",
                               "ConditionExpression": "n = :e",
                               "ExpressionAttributeValues": {":one": {"N": "1"}, ":e": {"N": str(expected)}}}}  # fmt: skip

        answers: list[Any] = [ddb.transact_write_items(TransactItems=[bump(k, 0) for k in keys])]
        answers[0].pop("ResponseMetadata")
        try:
            ddb.transact_write_items(
                TransactItems=[*(bump(k, 1) for k in keys[:3]), bump(keys[3], 9)]
            )
        except ClientError as exc:
            answers.append((exc.response["Error"]["Code"], exc.response.get("CancellationReasons")))
        answers.append(sorted(ddb.scan(TableName="t")["Items"], key=lambda i: i["PK"]["S"]))
        # A put of a new item, a delete and an update, undone by the last condition.
        try:
            ddb.transact_write_items(TransactItems=[
                {"Put": {"TableName": "t", "Item": {"PK": {"S": "new"}, "n": {"N": "1"}}}},
                {"Delete": {"TableName": "t", "Key": keys[0]}},
                bump(keys[1], 1),
                bump(keys[2], 9),
            ])  # fmt: skip
        except ClientError as exc:
            answers.append((exc.response["Error"]["Code"], exc.response.get("CancellationReasons")))
        answers.append(sorted(ddb.scan(TableName="t")["Items"], key=lambda i: i["PK"]["S"]))
        return answers


def _query_answers() -> list[Any]:
    """Queries of a base table (the patched path) and of an index, then a scan."""
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        ddb.create_table(
            TableName="t", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"},
                       {"AttributeName": "SK", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"}
                                  for a in ("PK", "SK", "G")],
            GlobalSecondaryIndexes=[{"IndexName": "by-g", "Projection": {"ProjectionType": "ALL"},
                                     "KeySchema": [{"AttributeName": "G", "KeyType": "HASH"},
                                                   {"AttributeName": "SK", "KeyType": "RANGE"}]}],
        )  # fmt: skip
        ddb.create_table(TableName="h", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])  # fmt: skip
        # Written out of order, across partitions, so order is the table's doing.
        for i in (7, 2, 9, 0, 5, 3, 8, 1, 6, 4):
            for pk in ("TENANT#b", "TENANT#a", "TENANT#c"):
                item = {"PK": {"S": pk}, "SK": {"S": f"SEAT#{i}" if i % 3 else f"TASK#{i}"},
                        "n": {"N": str(i)}, "G": {"S": f"g{i % 2}"}}  # fmt: skip
                ddb.put_item(TableName="t", Item=item)
            ddb.put_item(TableName="h", Item={"PK": {"S": f"h{i}"}, "n": {"N": str(i)}})

        def pages(**query: Any) -> list[Any]:
            found, start = [], None
            while True:
                more: dict[str, Any] = {"ExclusiveStartKey": start} if start else {}
                page = ddb.query(**query, **more)
                found.append((page["Items"], page["Count"], page["ScannedCount"]))
                start = page.get("LastEvaluatedKey")
                if not start:
                    return found

        def values(**named: str) -> dict[str, Any]:
            return {f":{k}": {"S": v} for k, v in named.items()}

        return [
            pages(TableName="t", KeyConditionExpression="PK = :p", ExpressionAttributeValues=values(p="TENANT#a")),
            pages(TableName="t", KeyConditionExpression="PK = :p AND begins_with(SK, :s)",
                  ExpressionAttributeValues=values(p="TENANT#b", s="SEAT#"), ConsistentRead=True),
            pages(TableName="t", KeyConditionExpression="PK = :p AND SK BETWEEN :x AND :y",
                  ExpressionAttributeValues=values(p="TENANT#c", x="SEAT#2", y="SEAT#7"),
                  ScanIndexForward=False),
            pages(TableName="t", KeyConditionExpression="PK = :p", Limit=3,
                  ExpressionAttributeValues=values(p="TENANT#a")),
            pages(TableName="t", KeyConditionExpression="PK = :p", FilterExpression="n > :n",
                  ProjectionExpression="SK, n", Limit=4,
                  ExpressionAttributeValues={**values(p="TENANT#c"), ":n": {"N": "3"}}),
            pages(TableName="t", KeyConditionExpression="PK = :p", ExpressionAttributeValues=values(p="none")),
            pages(TableName="t", IndexName="by-g", KeyConditionExpression="G = :g",
                  ExpressionAttributeValues=values(g="g1")),
            pages(TableName="h", KeyConditionExpression="PK = :p", ExpressionAttributeValues=values(p="h3")),
            ddb.scan(TableName="t", Limit=7)["Items"],
        ]  # fmt: skip


def _jsonpath_answers() -> list[Any]:
    # The paths moto's EventBridge reads from every event it delivers to a target.
    event = {"version": "0", "id": "e-1", "detail-type": "Task Started", "source": "agentq",
             "account": "123456789012", "time": "2026-11-26T10:00:00Z", "region": REGION,
             "resources": ["r"], "detail": {"requestId": "r-1", "n": [1, 2]}}  # fmt: skip
    paths = ["$.version", "$.id", "$.detail-type", "$.source", "$.account", "$.time",
             "$.region", "$.resources", "$.detail", "$.detail.n[1]"]  # fmt: skip
    parse = jsonpath_ng.ext.parse
    return [[match.value for match in parse(path).find(event)] for _ in range(2) for path in paths]


@pytest.mark.parametrize(
    "answers",
    [_sqs_answers, _dynamodb_answers, _query_answers, _jsonpath_answers],
    ids=["sqs", "dynamodb-transactions", "dynamodb-queries", "jsonpath"],
)
def test_a_patch_changes_nothing_moto_answers(
    answers: Callable[[], list[Any]], restore: Callable[[], None]
) -> None:
    plain = answers()
    restore()  # now patched
    assert answers() == plain


# Update expressions of one to five clauses, each keyword possibly more than once (two SET
# clauses are an error; when two keywords repeat, which one moto names depends on where
# in the expression's tree the first repeat sits), over paths that may overlap, on an
# item of every kind of value.
_SET_VALUES = [":v", "if_not_exists(a, :v)", "if_not_exists(z, :v)", "n + :one",
               "list_append(l, :l)", "#b", "m.x"]  # fmt: skip
_PATHS = ["a", "#b", "z", "m.x", "m.y", "l[0]", "l[1]", "n"]
_action = {
    "SET": st.builds("{} = {}".format, st.sampled_from(_PATHS), st.sampled_from(_SET_VALUES)),
    "ADD": st.sampled_from(["n :one", "s :s", "z :one", "a :one"]),
    "REMOVE": st.sampled_from(_PATHS),
    "DELETE": st.sampled_from(["s :s", "a :s"]),
}
_clause = st.sampled_from(sorted(_action)).flatmap(
    lambda keyword: st.lists(_action[keyword], min_size=1, max_size=3).map(
        lambda actions: f"{keyword} {', '.join(actions)}"
    )
)
_expressions = st.lists(
    st.lists(_clause, min_size=1, max_size=5).map(" ".join), min_size=4, max_size=10
)


def _update_answers(expressions: list[str]) -> list[Any]:
    """Each expression applied (or refused) in turn on one item: the item or the error."""
    with mock_aws():
        ddb = moto_client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}])  # fmt: skip
        key = {"PK": {"S": "k"}}
        ddb.put_item(TableName="t", Item={**key, "a": {"S": "x"}, "b": {"N": "2"}, "n": {"N": "1"},
                                          "s": {"SS": ["p", "q"]}, "l": {"L": [{"N": "1"}]},
                                          "m": {"M": {"x": {"S": "y"}}}})  # fmt: skip
        answers: list[Any] = []
        for expression in expressions:
            used = {":v": {"S": "v"}, ":one": {"N": "1"}, ":l": {"L": [{"N": "2"}]},
                    ":s": {"SS": ["q"]}}  # fmt: skip
            try:
                answers.append(ddb.update_item(
                    TableName="t", Key=key, UpdateExpression=expression, ReturnValues="ALL_NEW",
                    ExpressionAttributeNames={"#b": "b"} if "#b" in expression else {},
                    ExpressionAttributeValues={k: v for k, v in used.items() if k in expression},
                )["Attributes"])  # fmt: skip
            except ClientError as exc:
                answers.append((exc.response["Error"]["Code"], exc.response["Error"]["Message"]))
        return answers


@settings(max_examples=60, deadline=None, database=None)
@given(expressions=_expressions)
def test_update_expressions_answer_as_moto_does(expressions: list[str]) -> None:
    assert_answers_as_moto(_update_answers, expressions)


def test_update_expressions_with_two_repeated_keywords_fail_as_in_moto(
    restore: Callable[[], None],
) -> None:
    """moto checks bottom-up: the error is that of the deepest node holding a repeat (in
    the second, the clauses after `REMOVE z`: two SETs, one REMOVE). A count made once at
    the root would say REMOVE there (it checks ADD, then REMOVE, then SET)."""
    twice = ["SET a = :v ADD n :one SET #b = :v ADD n :one",
             "REMOVE z SET a = :v REMOVE m.x SET #b = :v"]  # fmt: skip
    plain = _update_answers(twice)
    assert [answer[0] for answer in plain] == ["ValidationException"] * 2
    assert '"ADD" section' in plain[0][1] and '"SET" section' in plain[1][1]
    restore()
    assert _update_answers(twice) == plain


def test_the_remembering_dispatcher_answers_as_moto_does() -> None:
    plain = werkzeug_app.DomainDispatcherApplication(create_backend_app)
    remembering: Any = _dispatcher(create_backend_app)
    for host in ("sqs.eu-west-1.amazonaws.com", "dynamodb", "events.eu-west-1.amazonaws.com",
                 "s3.eu-west-1.amazonaws.com", None, "nowhere.example") * 2:  # fmt: skip
        assert remembering.get_backend_for_host(host) == plain.get_backend_for_host(host)


# -- a reshaped target is refused ----------------------------------------------------------


def _refused(start: Callable[[], object], package: str = MOTO) -> str:
    with pytest.raises(IncompatibleDependency) as refused:
        start()
    message = str(refused.value)
    assert message.startswith(f"{package}: ")
    assert "agentq/local/moto_" in message and "patches it" in message
    return message


def test_a_changed_dispatcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def lookup(self: object, host: str | None, region: str) -> None: ...

    monkeypatch.setattr(werkzeug_app.DomainDispatcherApplication, "get_backend_for_host", lookup)
    assert "get_backend_for_host" in _refused(lambda: _dispatcher(create_backend_app))


def test_a_changed_jsonpath_parse_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    monkeypatch.setattr(jsonpath_ng.ext, "parse", lambda expression: expression)
    package = f"jsonpath-ng {metadata.version('jsonpath-ng')}"
    assert "jsonpath_ng.ext.parse" in _refused(restore, package)


def test_a_changed_sqs_clock_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    monkeypatch.setattr(sqs_models, "unix_time", lambda: 0.0)
    assert "unix_time" in _refused(restore)
    monkeypatch.delattr(sqs_models, "unix_time")
    assert "no longer uses unix_time" in _refused(restore)


def test_a_changed_method_lookup_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    def call_action(self: object) -> None:
        del self  # finds its method another way: remembering the lookup would do nothing

    monkeypatch.setattr(moto_responses.BaseResponse, "call_action", call_action)
    assert "lists its class's methods" in _refused(restore)
    monkeypatch.setattr(moto_responses, "method_names_from_class", lambda cls, inherited: [])
    assert "method_names_from_class(clazz)" in _refused(restore)


def test_a_changed_retention_check_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    def is_message_valid_based_on_retention_period(self: object, queue_name: str) -> bool:
        return True

    monkeypatch.setattr(sqs_models.SQSBackend, "is_message_valid_based_on_retention_period",
                        is_message_valid_based_on_retention_period)  # fmt: skip
    assert "is_message_valid_based_on_retention_period" in _refused(restore)


def test_a_transaction_that_no_longer_copies_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    def transact_write_items(self: object, transact_items: list[dict[str, Any]]) -> None:
        del self, transact_items  # copies nothing: the patch would do nothing

    backend = dynamodb_models.DynamoDBBackend
    monkeypatch.setattr(backend, "transact_write_items", transact_write_items)
    assert "copy.deepcopy" in _refused(restore)


def test_nothing_is_patched_when_one_target_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    monkeypatch.delattr(sqs_models, "unix_time_millis")
    parse = jsonpath_ng.ext.parse
    _refused(restore)
    assert jsonpath_ng.ext.parse is parse  # checked first, patched after: all or nothing


def test_a_query_that_no_longer_filters_all_items_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    def query(
        self: object,
        hash_key: object,
        range_comparison: object,
        range_objs: object,
        limit: object,
        exclusive_start_key: object,
        scan_index_forward: object,
        projection_expressions: object,
        index_name: object = None,
        consistent_read: object = False,
        filter_expression: object = None,
        hash_key_conditions: object = None,
        range_key_conditions: object = None,
    ) -> None:
        del self  # a moto that indexes partitions itself: nothing for the patch to do

    monkeypatch.setattr(Table, "query", query)
    message = _refused(restore)
    assert "agentq/local/moto_partitions.py" in message and "hash key" in message


def test_an_action_count_check_in_another_order_is_refused(
    monkeypatch: pytest.MonkeyPatch, restore: Callable[[], None]
) -> None:
    def verify_action_counts(self: object, node: Any) -> Any:
        for name in ("SET", "ADD", "REMOVE"):  # another order: other errors first
            clauses = node.find_clauses(
                [getattr(ast_nodes, f"UpdateExpression{name.title()}Clause")]
            )
            if len(clauses) > 1:
                raise validators.TooManyClauses(name)
        return node

    monkeypatch.setattr(
        validators.ActionCountValidator, "verify_action_counts", verify_action_counts
    )
    assert "ADD, REMOVE, SET" in _refused(restore)
