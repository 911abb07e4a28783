"""Each moto patch: refused when its target changed shape, and invisible in moto's answers.

For every patch, a representative call runs against moto in-process twice, without and
with the patch, and the answers must be equal; and a target reshaped the way an
upgrade could reshape it makes the launcher refuse, naming the package and version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import boto3
import jsonpath_ng.ext
import moto.dynamodb.models as dynamodb_models
import moto.sqs.models as sqs_models
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.moto_server import werkzeug_app
from moto.moto_server.werkzeug_app import create_backend_app

from agentq.errors import IncompatibleDependency
from agentq.local.moto_server import _dispatcher, speed_up_moto

REGION = "eu-west-1"
MOTO = f"moto {metadata.version('moto')}"


@pytest.fixture
def restore(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Patch moto for one test; monkeypatch puts every original back afterwards."""
    monkeypatch.setattr(jsonpath_ng.ext, "parse", jsonpath_ng.ext.parse)
    for name in ("unix_time", "unix_time_millis"):
        monkeypatch.setattr(sqs_models, name, getattr(sqs_models, name))
    monkeypatch.setattr(dynamodb_models, "copy", dynamodb_models.copy)
    backend = dynamodb_models.DynamoDBBackend
    monkeypatch.setattr(backend, "transact_write_items", backend.transact_write_items)
    return speed_up_moto


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    yield


# -- answers without and with each patch ---------------------------------------------------


def _sqs_answers() -> list[Any]:
    """Send, delay, receive, hide and receive again: what a worker's queue sees."""
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
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
        return [
            sorted((m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in messages),
            [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again["Messages"]],
            {k: counts[k] for k in counts if k.startswith("ApproximateNumberOfMessages")},
        ]


def _dynamodb_answers() -> list[Any]:
    """A transaction that commits, then one whose last condition fails and rolls back."""
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
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
    [_sqs_answers, _dynamodb_answers, _jsonpath_answers],
    ids=["sqs", "dynamodb", "jsonpath"],
)
def test_a_patch_changes_nothing_moto_answers(
    answers: Callable[[], list[Any]], restore: Callable[[], None]
) -> None:
    plain = answers()
    restore()  # now patched
    assert answers() == plain


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
    assert "agentq/local/moto_server.py" in message
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
