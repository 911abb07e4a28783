"""IAM on the local stack: moto checks each call the way AWS does, and each component's
user holds exactly the statements the CDK templates give its role."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st

from agentq.aws import new_session
from agentq.local.aws import (
    LOCAL_CREDENTIALS,
    LOCAL_REGION,
    LocalResources,
    MotoServer,
    local_session_clients,
    provision,
)
from agentq.local.iam import (
    COMPONENTS,
    NAMED_RESOURCES,
    UNRESOLVED,
    Credentials,
    _remove_action,
    create_component_users,
    local_statements,
    synthesized_policies,
)
from agentq.local.moto_iam import ACCOUNT_ID, request_checks
from agentq.resources import ResourceNames
from infra.local_policies import _Resolver

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=3, max_size=40)
KINDS = st.sampled_from(["Put", "Update", "Delete", "ConditionCheck"])
ACTION_OF = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
             "ConditionCheck": "ConditionCheckItem"}  # fmt: skip


def _table(name: str) -> str:
    return f"arn:aws:dynamodb:{LOCAL_REGION}:{ACCOUNT_ID}:table/{name}"


def _checks(action: str, body: dict[str, Any], resource: str = "*") -> list[tuple[str, str]]:
    return request_checks(
        action, resource, json.dumps(body).encode(), region=LOCAL_REGION, account=ACCOUNT_ID
    )


# -- how a request is authorized (pure) ----------------------------------------------------
@given(table=NAMES, index=st.none() | NAMES, action=st.sampled_from(["Query", "Scan", "GetItem"]))
def test_iam_dynamodb_call_is_checked_on_its_table_or_index(
    table: str, index: str | None, action: str
) -> None:
    body: dict[str, Any] = {"TableName": table}
    if index is not None:
        body["IndexName"] = index
    expected = _table(table) + (f"/index/{index}" if index is not None else "")
    assert _checks(f"dynamodb:{action}", body) == [(f"dynamodb:{action}", expected)]


@given(items=st.lists(st.tuples(KINDS, NAMES), min_size=1, max_size=10))
def test_iam_transaction_is_checked_item_by_item_as_the_items_own_action(
    items: list[tuple[str, str]],
) -> None:
    body = {"TransactItems": [{kind: {"TableName": table}} for kind, table in items]}
    assert _checks("dynamodb:TransactWriteItems", body) == [
        (f"dynamodb:{ACTION_OF[kind]}", _table(table)) for kind, table in items
    ]


@given(buses=st.lists(st.none() | NAMES, min_size=1, max_size=10))
def test_iam_put_events_is_checked_on_each_entrys_bus(buses: list[str | None]) -> None:
    entries = [{"EventBusName": bus} if bus else {} for bus in buses]
    checked = _checks("events:PutEvents", {"Entries": entries})
    assert {resource for _, resource in checked} == {
        f"arn:aws:events:{LOCAL_REGION}:{ACCOUNT_ID}:event-bus/{bus or 'default'}" for bus in buses
    }


@given(body=st.binary(max_size=64))
def test_iam_unreadable_body_keeps_motos_own_check(body: bytes) -> None:
    for action in ("dynamodb:GetItem", "events:PutEvents", "s3:GetObject"):
        checked = request_checks(action, "*", body, region=LOCAL_REGION, account=ACCOUNT_ID)
        assert checked and all(a.split(":")[0] == action.split(":")[0] for a, _ in checked)


def test_iam_cloudwatch_is_checked_under_its_iam_prefix_not_its_signing_name() -> None:
    assert request_checks("monitoring:GetMetricStatistics", "*", b"", region="r", account="a") == [
        ("cloudwatch:GetMetricStatistics", "*")
    ]


def test_iam_sqs_batches_are_checked_as_the_single_action() -> None:
    queue = f"arn:aws:sqs:{LOCAL_REGION}:{ACCOUNT_ID}:q"
    for batch, single in (("DeleteMessageBatch", "DeleteMessage"),
                          ("ChangeMessageVisibilityBatch", "ChangeMessageVisibility"),
                          ("SendMessageBatch", "SendMessage")):  # fmt: skip
        assert request_checks(f"sqs:{batch}", queue, b"", region="r", account="a") == [
            (f"sqs:{single}", queue)
        ]


# -- what the templates grant, resolved ----------------------------------------------------
def test_iam_resolver_follows_imports_joins_and_names_what_does_not_exist_locally() -> None:
    names = ResourceNames(stage="dev")
    templates: dict[str, dict[str, Any]] = {
        "core": {
            "Resources": {
                "Q": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": names.task_queue}},
                "B": {"Type": "AWS::S3::Bucket", "Properties": {}},
            },
            "Outputs": {"o": {"Value": {"Fn::GetAtt": ["Q", "Arn"]}, "Export": {"Name": "x:q"}}},
        },
        "fn": {"Resources": {"L": {"Type": "AWS::Logs::LogGroup", "Properties": {}}}},
    }
    resolver = _Resolver(templates, names, {"core/B"}, named_resources=NAMED_RESOURCES,
                         unresolved=UNRESOLVED)  # fmt: skip
    statement = {
        "Effect": "Allow",
        "Action": "s3:GetObject",
        "Resource": [
            {"Fn::ImportValue": "x:q"},
            {"Fn::Join": ["", [{"Fn::GetAtt": ["B", "Arn"]}, "/task/logs/*"]]},
            {"Fn::GetAtt": ["L", "Arn"]},
            "*",
        ],
    }
    resolved = resolver.resolve("fn", statement)
    assert (
        resolved["Resource"][0]
        == "arn:aws:sqs:${AWS::Region}:${AWS::AccountId}:${agentq:task_queue}"
    )
    assert (
        resolver.resolve("core", statement["Resource"][1])
        == "arn:aws:s3:::${agentq:bucket}/task/logs/*"
    )
    assert resolved["Resource"][2].startswith(UNRESOLVED)
    assert resolved["Resource"][3] == "*"


def test_iam_removing_an_action_keeps_the_rest_and_refuses_one_never_granted() -> None:
    statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": ["a:X", "a:Y"], "Resource": "r"},
                  {"Effect": "Allow", "Action": "a:Z", "Resource": "r"}]  # fmt: skip
    assert _remove_action(statements, "a:Z") == [statements[0]]
    assert _remove_action(statements, "a:X")[0]["Action"] == ["a:Y"]
    with pytest.raises(Exception, match="a:W is not granted"):
        _remove_action(statements, "a:W")


def test_iam_removing_a_statement_by_its_sid_keeps_the_rest() -> None:
    statements: list[dict[str, Any]] = [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "r/task/*"},
        {"Sid": "ReadArchive", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "r/dlq/*"},
    ]
    # The same action another statement grants stays granted there.
    assert _remove_action(statements, "ReadArchive") == [statements[0]]


# -- moto's server enforcing it ------------------------------------------------------------
@pytest.fixture(scope="module")
def enforced() -> Iterator[tuple[MotoServer, LocalResources]]:
    with MotoServer(iam=True) as server:
        clients = local_session_clients(server.url)
        yield server, provision(clients, ResourceNames(stage="iam"), endpoint_url=server.url)


def _session(server: MotoServer, credentials: Credentials, service: str) -> Any:
    session = new_session(LOCAL_REGION, access_key_id=credentials.access_key_id,
                          secret_access_key=credentials.secret_access_key)  # fmt: skip
    return session.client(service, endpoint_url=server.url)


def _iam(server: MotoServer) -> Any:
    return boto3.client("iam", endpoint_url=server.url, region_name=LOCAL_REGION,
                        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip


def _denied(call: Any, action: str) -> None:
    with pytest.raises(ClientError) as raised:
        call()
    assert f"not authorized to perform: {action}" in str(raised.value)


def test_iam_enforced_moto_allows_exactly_the_named_table_queue_and_bus(
    enforced: tuple[MotoServer, LocalResources],
) -> None:
    server, resources = enforced
    statements: list[dict[str, Any]] = [
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:PutItem"],
         "Resource": "arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${agentq:events_table}"},
        {"Effect": "Allow", "Action": ["sqs:SendMessage", "sqs:ReceiveMessage", "sqs:DeleteMessage"],
         "Resource": "arn:aws:sqs:${AWS::Region}:${AWS::AccountId}:${agentq:task_queue}"},
        {"Effect": "Allow", "Action": "events:PutEvents",
         "Resource": "arn:aws:events:${AWS::Region}:${AWS::AccountId}:event-bus/${agentq:event_bus}"},
    ]  # fmt: skip
    (user,) = create_component_users(
        _iam(server), resources, {"probe": statements}, region=LOCAL_REGION, account=ACCOUNT_ID
    ).values()
    ddb, sqs = _session(server, user, "dynamodb"), _session(server, user, "sqs")
    events = _session(server, user, "events")
    item = {"PK": {"S": "TASK#t#a"}, "SK": {"S": "STATE"}}
    ddb.put_item(TableName=resources.table_name, Item=item)
    assert ddb.get_item(TableName=resources.table_name, Key=item)["Item"] == item
    _denied(lambda: ddb.put_item(TableName=resources.definitions_table,
                                 Item={"definitionId": {"S": "x"}}), "dynamodb:PutItem")  # fmt: skip
    _denied(lambda: ddb.update_item(TableName=resources.table_name, Key=item,
                                    UpdateExpression="SET a = :a",
                                    ExpressionAttributeValues={":a": {"S": "1"}}),
            "dynamodb:UpdateItem")  # fmt: skip
    # A transaction is allowed only if every item's own action is.
    _denied(lambda: ddb.transact_write_items(TransactItems=[
        {"Put": {"TableName": resources.table_name, "Item": item}},
        {"ConditionCheck": {"TableName": resources.table_name, "Key": item,
                            "ConditionExpression": "attribute_exists(PK)"}}]),
        "dynamodb:ConditionCheckItem")  # fmt: skip
    sqs.send_message(QueueUrl=resources.queue_url, MessageBody="x")
    (message,) = sqs.receive_message(QueueUrl=resources.queue_url, WaitTimeSeconds=1)["Messages"]
    sqs.delete_message_batch(QueueUrl=resources.queue_url,
                             Entries=[{"Id": "1", "ReceiptHandle": message["ReceiptHandle"]}])  # fmt: skip
    _denied(
        lambda: sqs.send_message(QueueUrl=resources.dlq_url, MessageBody="x"), "sqs:SendMessage"
    )
    entry = {"Source": "agentq", "DetailType": "probe", "Detail": "{}"}
    assert (
        events.put_events(Entries=[{**entry, "EventBusName": resources.bus_name}])[
            "FailedEntryCount"
        ]
        == 0
    )
    _denied(lambda: events.put_events(Entries=[entry]), "events:PutEvents")  # the default bus
    # The stack's fixed admin key keeps every right.
    local_session_clients(server.url)["sqs"].send_message(
        QueueUrl=resources.dlq_url, MessageBody="y"
    )


def test_iam_component_policies_name_only_this_stages_resources(
    enforced: tuple[MotoServer, LocalResources],
) -> None:
    _, resources = enforced
    statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": "s3:GetObject",
                   "Resource": ["arn:aws:s3:::${agentq:bucket}/task/*",
                                "arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${agentq:events_table}"]}]  # fmt: skip
    (local,) = local_statements(statements, resources, region=LOCAL_REGION, account=ACCOUNT_ID)
    assert local["Resource"] == [
        f"arn:aws:s3:::{resources.bucket}/task/*",
        _table(resources.table_name),
    ]
    assert set(COMPONENTS) == {"worker", "save-event", "dlq-processor", "dispatcher",
                               "health-check", "reconciler", "producer-api", "producer",
                               "operator", "definitions-loader", "provider-framework",
                               "execution-role"}  # fmt: skip


def test_iam_synthesized_policies_cover_every_component_with_local_resources() -> None:
    policies = synthesized_policies()
    assert set(policies) == set(COMPONENTS)
    text = {component: json.dumps(statements) for component, statements in policies.items()}
    for component, statements in policies.items():
        assert statements, component
        # No intrinsic is left unresolved: everything is a string ARN, a token or "*".
        assert "Fn::" not in text[component] and '"Ref"' not in text[component], component
    # What the enforced run found missing is granted now.
    worker = [s for s in policies["worker"] if "sqs:SendMessage" in s["Action"]]
    assert worker
    queues = worker[0]["Resource"]
    queues = queues if isinstance(queues, list) else [queues]
    # Every priority tier's queue, the default tier's being the task queue itself.
    assert any(q.endswith("${agentq:task_queue}") for q in queues)
    assert any(q.endswith("${agentq:tier:high}") for q in queues)
    assert "ecs:UpdateTaskProtection" in text["worker"]
    # Resources that exist only in AWS grant nothing locally; "*" stays only where AWS
    # allows nothing else.
    assert UNRESOLVED in text["save-event"]
    for statements in policies.values():
        for statement in statements:
            resources = statement["Resource"]
            if "*" in (resources if isinstance(resources, list) else [resources]):
                actions = (
                    statement["Action"]
                    if isinstance(statement["Action"], list)
                    else [statement["Action"]]
                )
                assert set(actions) <= {"xray:PutTraceSegments", "xray:PutTelemetryRecords",
                                        "cloudwatch:GetMetricStatistics",
                                        "cloudwatch:GetMetricData",
                                        "ecr:GetAuthorizationToken"}, statement  # fmt: skip
