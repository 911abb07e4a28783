"""The local AWS rule: a message's visibility ends at most 12 hours after its receive.

moto in-process on a controllable clock (moto's SQS clock is patched, so hours pass at
once): with the rule, each answer is AWS's; without it, moto answers otherwise, which
`test_moto_alone_breaks_the_rule` pins so the rule is dropped the day moto keeps it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import moto.sqs.models as sqs_models
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto_support import in_process_moto  # noqa: F401 (a fixture)

from agentq.errors import IncompatibleDependency
from agentq.local.rules import (
    RULES,
    dynamodb_index_lag,
    dynamodb_transaction_conflict,
    install_all,
    sqs_visibility_cap,
)

REGION = "eu-west-1"
HOUR_S = 3600


class Clock:
    """moto's SQS clock, moved by the test (epoch ms)."""

    def __init__(self) -> None:
        self.ms = 1_900_000_000_000.0

    def millis(self, dt: Any = None) -> float:
        return self.ms

    def seconds(self, dt: Any = None) -> float:
        return self.ms / 1000

    def advance(self, seconds: float) -> None:
        self.ms += seconds * 1000


def keep_rule_originals(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the rule patches, put back when `monkeypatch` undoes."""
    backend, message = sqs_models.SQSBackend, sqs_models.Message
    for name in ("change_message_visibility", "change_message_visibility_batch"):
        monkeypatch.setattr(backend, name, getattr(backend, name))
    monkeypatch.setattr(message, "mark_received", message.mark_received)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    keep_rule_originals(monkeypatch)
    moved = Clock()
    monkeypatch.setattr(sqs_models, "unix_time_millis", moved.millis)
    monkeypatch.setattr(sqs_models, "unix_time", moved.seconds)
    return moved


@pytest.fixture
def sqs(in_process_moto: None) -> Iterator[Any]:  # noqa: F811 (the fixture's name)
    with mock_aws():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
        yield client, url


def receive(sqs: Any) -> dict[str, Any]:
    client, url = sqs
    [message] = client.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]
    return dict(message)


def change(sqs: Any, message: dict[str, Any], seconds: int) -> None:
    client, url = sqs
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=seconds
    )


def visible(sqs: Any) -> int:
    client, url = sqs
    return len(client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []))


def waited_in_queue_then_extended(sqs: Any, clock: Clock) -> None:
    """A message received 11 h after its send gets 11 h more: it ends within 12 h of its
    receive."""
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody="waited")
    clock.advance(11 * HOUR_S)
    message = receive(sqs)
    clock.advance(60)
    change(sqs, message, 11 * HOUR_S)


def received_again_then_extended(sqs: Any, clock: Clock) -> None:
    """The 12 hours start again at each receive."""
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody="again")
    receive(sqs)
    clock.advance(13 * HOUR_S)  # its 30 s lapsed long ago
    message = receive(sqs)
    change(sqs, message, 11 * HOUR_S + 59 * 60)


def batch_with_one_too_long(sqs: Any, clock: Clock) -> dict[str, Any]:
    client, url = sqs
    for body in ("a", "b"):
        client.send_message(QueueUrl=url, MessageBody=body)
    messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]
    clock.advance(10)
    return dict(client.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[{"Id": "long", "ReceiptHandle": messages[0]["ReceiptHandle"],
                  "VisibilityTimeout": 43_200},
                 {"Id": "short", "ReceiptHandle": messages[1]["ReceiptHandle"],
                  "VisibilityTimeout": 600}],
    ))  # fmt: skip


def test_the_rule_is_listed_and_installed_by_install_all(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "sqs_visibility_cap" in RULES
    # In this process no server ends a transaction in flight nor needs indexes to lag.
    monkeypatch.setenv(dynamodb_transaction_conflict.VARIABLE, "0")
    monkeypatch.setenv(dynamodb_index_lag.VARIABLE, "0")
    install_all()
    install_all()  # idempotent
    assert hasattr(sqs_models.SQSBackend.change_message_visibility, "agentq_rule")


def test_a_visibility_past_12_hours_from_the_receive_is_rejected_with_awss_error(
    sqs: Any, clock: Clock
) -> None:
    sqs_visibility_cap.install()
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody="m")
    message = receive(sqs)
    clock.advance(10)
    with pytest.raises(ClientError) as rejected:
        change(sqs, message, 43_200)  # would end 10 s past the 12 hours
    error = rejected.value.response["Error"]
    assert error["Code"] == "InvalidParameterValue"
    assert error["Message"] == sqs_visibility_cap.beyond_limit(43_200)
    # The longest still allowed is taken, and holds the message for all of it.
    change(sqs, message, 43_190)
    clock.advance(43_190 - 5)
    assert visible(sqs) == 0
    clock.advance(6)
    assert visible(sqs) == 1


def test_the_12_hours_count_from_the_receive_not_the_send(sqs: Any, clock: Clock) -> None:
    sqs_visibility_cap.install()
    waited_in_queue_then_extended(sqs, clock)
    clock.advance(11 * HOUR_S - 5)
    assert visible(sqs) == 0


def test_the_12_hours_start_again_at_each_receive(sqs: Any, clock: Clock) -> None:
    sqs_visibility_cap.install()
    received_again_then_extended(sqs, clock)
    clock.advance(11 * HOUR_S)
    assert visible(sqs) == 0


def test_each_entry_of_a_batch_is_judged_alone(sqs: Any, clock: Clock) -> None:
    sqs_visibility_cap.install()
    answer = batch_with_one_too_long(sqs, clock)
    assert [s["Id"] for s in answer["Successful"]] == ["short"]
    [failed] = answer["Failed"]
    assert failed["Id"] == "long" and failed["SenderFault"] is True
    assert failed["Code"] == "InvalidParameterValue"
    assert failed["Message"] == sqs_visibility_cap.beyond_limit(43_200)
    clock.advance(31)
    assert visible(sqs) == 1  # "long" kept its 30 s; "short" is hidden for 600 s


def test_moto_alone_breaks_the_rule(sqs: Any, clock: Clock) -> None:
    """What the rule changes: moto counts from the send, and fails a whole batch."""
    for scenario in (waited_in_queue_then_extended, received_again_then_extended):
        with pytest.raises(ClientError, match="beyond the limit"):
            scenario(sqs, clock)
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        batch_with_one_too_long(sqs, clock)


def test_a_reshaped_moto_is_refused(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    def change_message_visibility(self: Any, queue_name: str, receipt_handle: str) -> None:
        pass

    monkeypatch.setattr(
        sqs_models.SQSBackend, "change_message_visibility", change_message_visibility
    )
    with pytest.raises(IncompatibleDependency, match="moto"):
        sqs_visibility_cap.install()
    assert not hasattr(sqs_models.Message.mark_received, "agentq_rule")
