"""The fault mechanism itself: each kind reaches botocore's real retry path."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import Attempts, faulty_client, injector, rule

from agentq.aws import AwsClients
from agentq.faults.config import Kind
from agentq.faults.injector import FaultInjector, injected_counts
from agentq.faults.log import read_counts
from agentq.local.aws import LOCAL_REGION


def _key() -> dict[str, dict[str, str]]:
    return {"PK": {"S": f"T#{uuid.uuid4().hex}"}, "SK": {"S": "STATE"}}


def _get(stack: Stack, key: dict[str, dict[str, str]]) -> dict[str, object] | None:
    found = stack.dynamodb.get_item(
        TableName=stack.resources.table_name, Key=key, ConsistentRead=True
    )
    item: dict[str, object] | None = found.get("Item")
    return item


@pytest.mark.parametrize(
    "kind",
    [Kind.THROTTLE, Kind.SERVER_ERROR, Kind.CONNECTION_RESET, Kind.READ_TIMEOUT],
)
def test_pre_send_kinds_are_retried_by_botocore_and_not_applied(stack: Stack, kind: Kind) -> None:
    faults = injector(rule("dynamodb:PutItem", kind, limit=2))
    client = faulty_client(stack, "dynamodb", faults)
    attempts = Attempts()
    attempts.attach(client)
    key = _key()
    client.put_item(
        TableName=stack.resources.table_name,
        Item={**key, "n": {"N": "1"}},
        ConditionExpression="attribute_not_exists(PK)",
    )
    # Two injected failures, then botocore's third attempt succeeds: had either failed
    # attempt been applied, the condition would have refused the third.
    assert attempts.counts["PutItem"] == 3
    assert faults.counts() == {f"dynamodb:PutItem:{kind.value}": 2}
    assert _get(stack, key) is not None


def test_faults_past_the_retry_budget_surface_as_the_aws_error(stack: Stack) -> None:
    faults = injector(rule("sqs:SendMessage", Kind.THROTTLE))
    client = faulty_client(stack, "sqs", faults)
    attempts = Attempts()
    attempts.attach(client)
    with pytest.raises(ClientError) as caught:
        client.send_message(QueueUrl=stack.resources.queue_url, MessageBody="x")
    assert caught.value.response["Error"]["Code"] == "RequestThrottled"
    # client_config's max_attempts=5 counts retries: six attempts in all.
    assert attempts.counts["SendMessage"] == 6


def test_s3_throttling_is_slow_down(stack: Stack) -> None:
    faults = injector(rule("s3:PutObject", Kind.THROTTLE, limit=1))
    client = faulty_client(stack, "s3", faults)
    attempts = Attempts()
    attempts.attach(client)
    client.put_object(Bucket=stack.resources.bucket, Key="k", Body=b"v")
    assert attempts.counts["PutObject"] == 2
    assert client.get_object(Bucket=stack.resources.bucket, Key="k")["Body"].read() == b"v"


def test_applied_then_failed_applies_the_write_and_botocore_retries_it(stack: Stack) -> None:
    faults = injector(rule("dynamodb:UpdateItem", Kind.APPLIED_THEN_FAILED, limit=1))
    client = faulty_client(stack, "dynamodb", faults)
    attempts = Attempts()
    attempts.attach(client)
    key = _key()
    client.update_item(
        TableName=stack.resources.table_name,
        Key=key,
        UpdateExpression="ADD n :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    # One call, applied by the lost attempt and again by botocore's retry.
    assert attempts.counts["UpdateItem"] == 2
    assert _get(stack, key) == {**key, "n": {"N": "2"}}


def test_applied_then_failed_conditional_write_meets_its_own_effect(stack: Stack) -> None:
    faults = injector(rule("dynamodb:PutItem", Kind.APPLIED_THEN_FAILED, limit=1))
    client = faulty_client(stack, "dynamodb", faults)
    key = _key()
    with pytest.raises(ClientError) as caught:
        client.put_item(
            TableName=stack.resources.table_name,
            Item=key,
            ConditionExpression="attribute_not_exists(PK)",
        )
    assert caught.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert _get(stack, key) == key


def test_transaction_conflict_on_a_write_is_not_retried(stack: Stack) -> None:
    faults = injector(rule("dynamodb:*", Kind.TRANSACTION_CONFLICT, limit=1))
    client = faulty_client(stack, "dynamodb", faults)
    attempts = Attempts()
    attempts.attach(client)
    key = _key()
    with pytest.raises(ClientError) as caught:
        client.put_item(TableName=stack.resources.table_name, Item=key)
    assert caught.value.response["Error"]["Code"] == "TransactionConflictException"
    assert attempts.counts["PutItem"] == 1
    assert _get(stack, key) is None


def test_transaction_conflict_cancels_a_transaction_with_reasons(stack: Stack) -> None:
    faults = injector(rule("dynamodb:TransactWriteItems", Kind.TRANSACTION_CONFLICT))
    client = faulty_client(stack, "dynamodb", faults)
    keys = [_key(), _key()]
    with pytest.raises(ClientError) as caught:
        client.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": stack.resources.table_name, "Item": key}} for key in keys
            ]
        )
    error = caught.value.response
    assert error["Error"]["Code"] == "TransactionCanceledException"
    codes = [reason["Code"] for reason in error["CancellationReasons"]]
    assert sorted(codes) == ["None", "TransactionConflict"]
    assert all(_get(stack, key) is None for key in keys)


def test_partial_sqs_batch_fails_entries_that_are_really_not_sent(stack: Stack) -> None:
    faults = injector(rule("sqs:SendMessageBatch", Kind.PARTIAL_BATCH, limit=1))
    client = faulty_client(stack, "sqs", faults)
    entries = [{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(6)]
    answer = client.send_message_batch(QueueUrl=stack.resources.queue_url, Entries=entries)
    failed = {entry["Id"] for entry in answer["Failed"]}
    sent = {entry["Id"] for entry in answer["Successful"]}
    assert failed and failed | sent == {f"e{i}" for i in range(6)} and not failed & sent
    bodies: set[str] = set()
    while received := stack.sqs.receive_message(
        QueueUrl=stack.resources.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
    ).get("Messages"):
        bodies |= {message["Body"] for message in received}
    assert bodies == {f"m{entry_id[1:]}" for entry_id in sent}


def test_partial_put_events_reports_failed_entries_in_place(stack: Stack) -> None:
    faults = injector(rule("events:PutEvents", Kind.PARTIAL_BATCH))
    client = faulty_client(stack, "events", faults)
    entries = [
        {
            "EventBusName": stack.resources.bus_name,
            "Source": "agentq.test",
            "DetailType": "Probe",
            "Detail": json.dumps({"i": i}),
        }
        for i in range(5)
    ]
    answer = client.put_events(Entries=entries)
    assert len(answer["Entries"]) == 5
    failed = [entry for entry in answer["Entries"] if "ErrorCode" in entry]
    assert answer["FailedEntryCount"] == len(failed) >= 1
    assert all("EventId" in entry for entry in answer["Entries"] if "ErrorCode" not in entry)

    single = client.put_events(Entries=entries[:1])
    assert single["FailedEntryCount"] == 1


def test_wildcards_leave_the_control_plane_alone(stack: Stack) -> None:
    faults = injector(rule("*", Kind.SERVER_ERROR))
    client = faulty_client(stack, "sqs", faults)
    client.get_queue_url(QueueName=stack.resources.queue_url.rsplit("/", 1)[-1])
    assert faults.total() == 0


def test_match_restricts_a_rule_to_requests_that_name_it(stack: Stack) -> None:
    key = _key()
    faults = injector(rule("dynamodb:PutItem", Kind.SERVER_ERROR, limit=1, match=key["PK"]["S"]))
    client = faulty_client(stack, "dynamodb", faults)
    client.put_item(TableName=stack.resources.table_name, Item=_key())
    assert faults.total() == 0
    client.put_item(TableName=stack.resources.table_name, Item=key)
    assert faults.total() == 1


def test_same_seed_replays_the_same_decisions() -> None:
    def decisions(seed: int) -> list[bool]:
        faults = injector(rule("*", Kind.THROTTLE, rate=0.3), seed=seed)
        return [
            faults.decide("send", "dynamodb", op, "") is not None
            for op in ("GetItem", "UpdateItem") * 50
        ]

    assert decisions(11) == decisions(11)
    assert decisions(11) != decisions(12)
    assert 10 < sum(decisions(11)) < 60


def test_environment_installs_faults_on_agentq_clients_and_logs_them(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "faults.jsonl"
    spec = {"rules": [{"op": "dynamodb:GetItem", "kind": "throttle", "rate": 1, "limit": 3}]}
    monkeypatch.setenv("AGENTQ_FAULTS", json.dumps(spec))
    monkeypatch.setenv("AGENTQ_FAULTS_SEED", "5")
    monkeypatch.setenv("AGENTQ_FAULTS_LOG", str(log))
    before = injected_counts().get("dynamodb:GetItem:throttle", 0)
    client = AwsClients(LOCAL_REGION).dynamodb
    attempts = Attempts()
    attempts.attach(client)
    client.get_item(TableName=stack.resources.table_name, Key=_key())
    assert attempts.counts["GetItem"] == 4
    assert read_counts(str(log)) == {"dynamodb:GetItem:throttle": 3}
    assert injected_counts()["dynamodb:GetItem:throttle"] - before == 3
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {line["pid"] for line in lines} and all(line["kind"] == "throttle" for line in lines)


def test_latency_delays_and_lets_the_call_through(stack: Stack) -> None:
    faults: FaultInjector = injector(rule("sqs:GetQueueAttributes", Kind.LATENCY, delay=0.0))
    client = faulty_client(stack, "sqs", faults)
    client.get_queue_attributes(QueueUrl=stack.resources.queue_url, AttributeNames=["All"])
    assert faults.counts() == {"sqs:GetQueueAttributes:latency": 1}
