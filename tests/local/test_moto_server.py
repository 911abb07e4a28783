"""The local moto launcher's speed-ups must not change a single answer moto gives."""

from __future__ import annotations

import copy
import datetime
import email.parser
import http.client
import io
import time
from typing import Any

import jsonpath_ng.ext
import moto.core.utils as moto_utils
import moto.dynamodb.models as dynamodb_models
import moto.sqs.models as sqs_models
import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from hypothesis import given, settings
from hypothesis import strategies as st
from moto.core import responses as moto_responses
from moto.dynamodb.models.table import Table
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto_support import patch_as_the_local_server

from agentq.local.moto_process import MotoServer
from agentq.local.moto_server import _dispatcher, _parse_headers, speed_up_moto

HOSTS = [
    "sqs.eu-west-1.amazonaws.com",
    "dynamodb",
    "events.eu-west-1.amazonaws.com",
    "s3.eu-west-1.amazonaws.com",
    "moto_api",
    None,
    "nowhere.example",
]


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> None:
    # The originals come back after the test: a patch left in place would hide a
    # changed target from the guards' tests.
    patch_as_the_local_server(monkeypatch)


def test_the_remembering_dispatcher_routes_every_host_as_moto_does() -> None:
    plain = DomainDispatcherApplication(create_backend_app)
    remembering = _dispatcher(create_backend_app)
    for _ in range(2):  # the second round answers from memory
        for host in HOSTS:
            assert remembering.get_backend_for_host(host) == plain.get_backend_for_host(host)  # type: ignore[attr-defined]
    assert remembering.get_backend_for_host("sqs.eu-west-1.amazonaws.com") == "sqs"  # type: ignore[attr-defined]


@pytest.mark.usefixtures("patched")
def test_sqs_reads_the_same_clock_without_datetime(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_datetime() -> datetime.datetime:
        raise AssertionError("the clock went through moto's datetime arithmetic")

    # moto's own unix_time() builds datetimes through utcnow(); the fast one must not.
    monkeypatch.setattr(moto_utils, "utcnow", no_datetime)
    before = time.time()
    seconds = sqs_models.unix_time()
    millis = sqs_models.unix_time_millis()
    after = time.time()
    assert before <= seconds <= after
    assert before * 1000 <= millis <= after * 1000
    # With a datetime, the answer is moto's own.
    moment = datetime.datetime(2026, 11, 26, 4, 30, 0, 250_000)
    assert sqs_models.unix_time(moment) == 1_795_667_400.25
    assert sqs_models.unix_time_millis(moment) == 1_795_667_400_250.0


@pytest.mark.usefixtures("patched")
def test_jsonpath_paths_are_parsed_once_and_still_find() -> None:
    parse = jsonpath_ng.ext.parse
    assert parse("$.detail") is parse("$.detail")
    event = {"detail": {"requestId": "r-1"}, "detail-type": "Task Started"}
    assert [m.value for m in parse("$.detail").find(event)] == [{"requestId": "r-1"}]
    assert [m.value for m in parse("$.detail-type").find(event)] == ["Task Started"]


@pytest.mark.usefixtures("patched")
def test_speeding_up_twice_wraps_once() -> None:
    parse, clock = jsonpath_ng.ext.parse, sqs_models.unix_time
    transact = dynamodb_models.DynamoDBBackend.transact_write_items
    speed_up_moto()
    assert jsonpath_ng.ext.parse is parse
    assert sqs_models.unix_time is clock
    assert dynamodb_models.DynamoDBBackend.transact_write_items is transact


@pytest.mark.usefixtures("patched")
def test_the_copy_stand_in_passes_everything_else_to_copy() -> None:
    stand_in = dynamodb_models.copy
    assert stand_in is not copy
    assert stand_in.copy is copy.copy
    value = {"a": [1, 2]}
    cloned = stand_in.deepcopy(value)
    assert cloned == value and cloned["a"] is not value["a"]


def _counter(stack: Stack, name: str, value: int) -> dict[str, Any]:
    stack.dynamodb.put_item(
        TableName=stack.resources.table_name,
        Item={"PK": {"S": name}, "SK": {"S": "STATE"}, "n": {"N": str(value)}},
    )
    return {"PK": {"S": name}, "SK": {"S": "STATE"}}


def _bump(stack: Stack, key: dict[str, Any], expected: int) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": stack.resources.table_name,
            "Key": key,
            "UpdateExpression": "SET n = n + :one",
            "ConditionExpression": "n = :expected",
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":expected": {"N": str(expected)}},
        }
    }


def _value(stack: Stack, key: dict[str, Any]) -> int:
    item = stack.dynamodb.get_item(TableName=stack.resources.table_name, Key=key)["Item"]
    return int(item["n"]["N"])


@pytest.mark.usefixtures("patched")
def test_a_transaction_copies_no_table_and_still_rolls_back(
    inproc_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [_counter(inproc_stack, f"c{i}", 0) for i in range(5)]
    table_copies = []
    real_deepcopy = copy.deepcopy

    def counting(value: Any, memo: Any = None) -> Any:
        if isinstance(value, Table):
            table_copies.append(value)
        return real_deepcopy(value, memo)

    monkeypatch.setattr(copy, "deepcopy", counting)

    inproc_stack.dynamodb.transact_write_items(
        TransactItems=[_bump(inproc_stack, k, 0) for k in keys]
    )
    assert [_value(inproc_stack, k) for k in keys] == [1] * 5
    assert table_copies == []  # moto alone copies the whole table once per item: 5

    # The last item's condition fails: the writes before it are undone, a new item put
    # by the transaction is gone and a deleted one is back.
    table = inproc_stack.resources.table_name
    new_key = {"PK": {"S": "fresh"}, "SK": {"S": "STATE"}}
    items = [
        *(_bump(inproc_stack, k, 1) for k in keys[:3]),
        {"Put": {"TableName": table, "Item": {**new_key, "n": {"N": "5"}}}},
        {"Delete": {"TableName": table, "Key": keys[3]}},
        _bump(inproc_stack, keys[4], 7),
    ]
    with pytest.raises(ClientError) as failure:
        inproc_stack.dynamodb.transact_write_items(TransactItems=items)
    assert failure.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert [_value(inproc_stack, k) for k in keys] == [1] * 5
    assert "Item" not in inproc_stack.dynamodb.get_item(TableName=table, Key=new_key)
    assert table_copies == []


# moto picks the service by the credential scope (it checks no signature without IAM).
SQS_SCOPE = "AWS4-HMAC-SHA256 Credential=testing/20261204/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0"


def _list_queues(connection: http.client.HTTPConnection, **request: Any) -> bytes:
    body = b"Action=ListQueues&Version=2012-11-05"
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": SQS_SCOPE}
    if request.pop("chunked", False):
        connection.request("POST", "/", body=iter([body]), headers=headers, encode_chunked=True)
    else:
        connection.request("POST", "/", body=request.pop("body", body), headers=headers)
    response = connection.getresponse()
    answer = response.read()
    assert response.status == 200, answer
    return answer


def test_the_server_answers_many_requests_on_one_connection(moto_server: MotoServer) -> None:
    # werkzeug closes every connection; the launcher keeps them open (botocore opened a
    # connection, and the server a thread, per call).
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=30)
    try:
        answers = []
        for _ in range(3):
            answers.append(_list_queues(connection))
            assert connection.sock is not None, "the server closed the connection"
            if len(answers) == 1:
                first = connection.sock
        assert connection.sock is first
        assert all(b"ListQueuesResponse" in answer for answer in answers)
    finally:
        connection.close()


def test_a_chunked_request_is_answered_and_its_connection_closed(moto_server: MotoServer) -> None:
    # A body without a length cannot be read ahead of the app: the server closes after it.
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=30)
    try:
        assert b"ListQueuesResponse" in _list_queues(connection, chunked=True)
        assert connection.sock is None, "a chunked request's connection stayed open"
        assert b"ListQueuesResponse" in _list_queues(connection)  # a new one is opened
    finally:
        connection.close()


def test_a_body_the_service_does_not_read_stays_out_of_the_next_request(
    moto_server: MotoServer,
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=30)
    try:
        connection.request("GET", "/moto-api/", body=b"GET / HTTP/1.1\r\n\r\n" * 50)
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        assert b"ListQueuesResponse" in _list_queues(connection)
        assert connection.sock is not None
    finally:
        connection.close()


def test_a_put_that_waits_for_100_continue_keeps_its_body(stack: Stack) -> None:
    # botocore sends a file's body only after the server's "100 Continue".
    body = bytes(range(256)) * 8192  # 2 MiB
    bucket = stack.resources.bucket
    stack.s3.put_object(Bucket=bucket, Key="k", Body=io.BytesIO(body))
    assert stack.s3.get_object(Bucket=bucket, Key="k")["Body"].read() == body
    assert stack.sqs.list_queues()["QueueUrls"]


_NAME = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_ODD_NAME = st.sampled_from(["", " X", "\tX", "From x", "a b", "X\rY", "é"])
_VALUE = st.text(st.characters(max_codepoint=255, exclude_characters="\n"), max_size=20)
_HEADER_LINE = st.tuples(st.one_of(_NAME, _NAME, _ODD_NAME), st.sampled_from([":", ": ", ":\t", ""]),
                         _VALUE, st.sampled_from(["\r\n", "\n", "\r\n", ""]))  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_HEADER_LINE, max_size=8), st.sampled_from(["\r\n", "\n", ""]))
def test_header_lines_parse_as_http_client_parses_them(
    lines: list[tuple[str, str, str, str]], end: str
) -> None:
    raw = "".join("".join(line) for line in lines) + end
    if "\n" not in raw:  # a request's header block always has its lines
        raw += "\r\n"
    ours = _parse_headers(io.BytesIO(raw.encode("iso-8859-1")))
    theirs = http.client.parse_headers(io.BytesIO(raw.encode("iso-8859-1")))
    assert ours.items() == theirs.items()
    assert type(ours) is type(theirs)


def test_plain_header_lines_skip_the_email_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_email_parser(**kwargs: Any) -> Any:
        raise AssertionError("plain lines went through the email parser")

    raw = b"Host: x\r\nContent-Length: 5\r\nX-Amz-Target: DynamoDB_20120810.PutItem\r\n\r\n"
    monkeypatch.setattr(email.parser, "Parser", no_email_parser)
    headers = _parse_headers(io.BytesIO(raw))
    assert headers.items() == [("Host", "x"), ("Content-Length", "5"),
                               ("X-Amz-Target", "DynamoDB_20120810.PutItem")]  # fmt: skip
    with pytest.raises(AssertionError, match="email parser"):  # a folded line still goes there
        _parse_headers(io.BytesIO(b"Host: x\r\n  folded\r\n\r\n"))


def test_in_process_moto_is_patched_as_the_server_and_then_left_as_found() -> None:
    # inproc_stack runs on the patched moto; the comparisons above need the plain one.
    originals = (jsonpath_ng.ext.parse, moto_responses.method_names_from_class, Table.query)
    with pytest.MonkeyPatch.context() as monkeypatch:
        patch_as_the_local_server(monkeypatch)
        patched = (jsonpath_ng.ext.parse, moto_responses.method_names_from_class, Table.query)
        assert all(now is not before for now, before in zip(patched, originals, strict=True))
    assert (jsonpath_ng.ext.parse, moto_responses.method_names_from_class, Table.query) == originals
