"""IAM conditions on the enforced local stack: evaluated as AWS evaluates them, where
moto alone grants a conditioned statement whatever the request; and S3's 403 for a
missing key a caller may not list (agentq.local.rules.s3_missing_key)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st

from agentq.local.aws import (
    LOCAL_CREDENTIALS,
    LOCAL_REGION,
    LocalResources,
    MotoServer,
    local_session_clients,
    provision,
)
from agentq.local.iam import Credentials, create_component_users, synthesized_policies
from agentq.local.iam_policy import Decision, condition_holds, decide
from agentq.local.moto_iam import ACCOUNT_ID, authorizations
from agentq.principals import mappable_principal, principal_pk
from agentq.resources import ROSTER_PK, ResourceNames
from agentq.store import keys
from agentq.store.tenants import LIMITS_SK, seat_sk, tenant_pk

TEXT = st.text(alphabet="abcdefghij/#-", max_size=12)


# -- the operators (pure) ---------------------------------------------------------------
@given(value=TEXT, other=TEXT)
def test_iam_string_like_matches_its_wildcard_and_negation_is_its_complement(
    value: str, other: str
) -> None:
    context = {"s3:prefix": [value + other]}
    assert condition_holds("StringLike", "s3:prefix", f"{value}*", context)
    assert not condition_holds("StringNotLike", "s3:prefix", f"{value}*", context)
    assert condition_holds("StringEquals", "s3:prefix", value + other, context)


def test_iam_a_missing_key_fails_a_condition_unless_negated_if_exists_or_for_all_values() -> None:
    # AWS: a key not in the request context does not match; a negated operator holds.
    assert not condition_holds("StringLike", "s3:prefix", "task/*", {})
    assert not condition_holds("StringEquals", "s3:prefix", "task/", {})
    assert condition_holds("StringNotLike", "s3:prefix", "task/*", {})
    assert condition_holds("StringLikeIfExists", "s3:prefix", "task/*", {})
    assert condition_holds("ForAllValues:StringEquals", "dynamodb:LeadingKeys", "a", {})
    assert not condition_holds("ForAnyValue:StringEquals", "dynamodb:LeadingKeys", "a", {})
    assert condition_holds("Null", "s3:prefix", "true", {})
    assert not condition_holds("Null", "s3:prefix", "false", {})


def test_iam_for_all_values_needs_every_value_inside_and_arn_like_keeps_arn_parts() -> None:
    keys = {"dynamodb:LeadingKeys": ["TENANT#acme#1", "TENANT#other#2"]}
    assert not condition_holds("ForAllValues:StringLike", "dynamodb:LeadingKeys",
                               ["TENANT#acme#*"], keys)  # fmt: skip
    assert condition_holds("ForAnyValue:StringLike", "dynamodb:LeadingKeys",
                           ["TENANT#acme#*"], keys)  # fmt: skip
    arn = {"aws:SourceArn": ["arn:aws:events:eu-west-1:123456789012:rule/agentq-x"]}
    assert condition_holds("ArnLike", "aws:SourceArn", "arn:aws:events:*:*:rule/agentq-*", arn)
    assert not condition_holds("ArnLike", "aws:SourceArn", "arn:aws:events:*:rule/agentq-*", arn)


def test_iam_an_unknown_operator_grants_nothing_and_lifts_no_deny() -> None:
    statement = {"Action": "s3:ListBucket", "Resource": "*",
                 "Condition": {"NumericLessThan": {"s3:max-keys": "10"}}}  # fmt: skip
    allow = {"Statement": [{**statement, "Effect": "Allow"}]}
    deny = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"},
                          {**statement, "Effect": "Deny"}]}  # fmt: skip
    assert decide([allow], "s3:ListBucket", "arn:aws:s3:::b", {}) is Decision.NONE
    assert decide([deny], "s3:ListBucket", "arn:aws:s3:::b", {}) is Decision.DENY


def test_iam_request_condition_keys_are_read_from_the_request() -> None:
    listing = authorizations("s3:ListBucket", "arn:aws:s3:::b", b"", region=LOCAL_REGION,
                             account=ACCOUNT_ID, path="/b?list-type=2&prefix=task%2Fa%2F")  # fmt: skip
    assert listing == [("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["task/a/"]})]
    # HeadBucket is authorized as s3:ListBucket, with no prefix.
    assert authorizations("s3:HeadBucket", "arn:aws:s3:::b", b"", region=LOCAL_REGION,
                          account=ACCOUNT_ID) == [("s3:ListBucket", "arn:aws:s3:::b", {})]  # fmt: skip
    query = {"TableName": "t", "KeyConditionExpression": "#p = :p AND SK > :s",
             "ExpressionAttributeNames": {"#p": "PK"},
             "ExpressionAttributeValues": {":p": {"S": "TENANT#acme"}, ":s": {"S": "a"}}}  # fmt: skip
    ((_, _, context),) = authorizations("dynamodb:Query", "*", json.dumps(query).encode(),
                                        region=LOCAL_REGION, account=ACCOUNT_ID,
                                        hash_key_of=lambda table: "PK")  # fmt: skip
    assert context == {"dynamodb:LeadingKeys": ["TENANT#acme"]}


# -- the synthesized roles' writes, by partition (pure) -----------------------------------
SYNTH_TABLE_ARN = "arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${agentq:events_table}"
# The items each writer builds, with the key functions the stores use.
TASK_ITEM = keys.state_key("acme", "r-1")
JOB_ITEM = {"PK": {"S": keys.job_pk("acme", "j-1")}, "SK": {"S": keys.JOB_SK}}
LIMITS_ITEM = {"PK": {"S": tenant_pk("acme")}, "SK": {"S": LIMITS_SK}}
SEAT_ITEM = {"PK": {"S": tenant_pk("acme")}, "SK": {"S": seat_sk(0)}}
MAPPING_ITEM = {
    "PK": {"S": principal_pk(mappable_principal("arn:aws:iam::123456789012:role/ci"))},
    "SK": {"S": "TENANT"},
}
ROSTER_ITEM = {"PK": {"S": ROSTER_PK}, "SK": {"S": "w-1"}}


def _may(statements: list[dict[str, Any]], action: str, item: dict[str, Any]) -> bool:
    """Whether the statements allow `action` on this item, as moto's enforced server
    asks (agentq.local.moto_iam: the item's partition key as dynamodb:LeadingKeys)."""
    ((checked, resource, context),) = authorizations(
        f"dynamodb:{action}", "*", json.dumps({"TableName": SYNTH_TABLE_ARN, "Key": item}).encode(),
        region=LOCAL_REGION, account=ACCOUNT_ID, hash_key_of=lambda table: "PK",
    )  # fmt: skip
    return decide([{"Statement": statements}], checked, resource, context) is Decision.ALLOW


@pytest.fixture(scope="module")
def synthesized() -> dict[str, list[dict[str, Any]]]:
    return synthesized_policies()


@pytest.mark.parametrize("role", ["producer", "dispatcher", "producer-api"])
def test_iam_producers_write_tasks_and_jobs_only(
    synthesized: dict[str, list[dict[str, Any]]], role: str
) -> None:
    # A producer that could put a PRINCIPAL# item would map itself to another tenant
    # (and read that tenant's tasks through the producer API); a TENANT# item, lift
    # its own tenant's limit or hold its seats.
    statements = synthesized[role]
    for action in ("PutItem", "UpdateItem"):
        assert _may(statements, action, TASK_ITEM) and _may(statements, action, JOB_ITEM)
        for item in (MAPPING_ITEM, LIMITS_ITEM, SEAT_ITEM, ROSTER_ITEM):
            assert not _may(statements, action, item), (role, action, item["PK"])
    # Nor read them: another principal's mapping, another tenant's limit or seats.
    assert _may(statements, "GetItem", TASK_ITEM) and _may(statements, "GetItem", JOB_ITEM)
    for item in (LIMITS_ITEM, SEAT_ITEM, ROSTER_ITEM):
        assert not _may(statements, "GetItem", item), (role, item["PK"])
    # The producer API reads the caller's tenant from its principal's mapping.
    assert _may(statements, "GetItem", MAPPING_ITEM) is (role == "producer-api")


def test_iam_operators_and_workers_keep_their_tenant_items(
    synthesized: dict[str, list[dict[str, Any]]],
) -> None:
    operator, worker = synthesized["operator"], synthesized["worker"]
    # `agentq tenants limit` / `map` put whole items; `limit T default` / `unmap` delete.
    for item in (LIMITS_ITEM, MAPPING_ITEM):
        assert _may(operator, "PutItem", item) and _may(operator, "DeleteItem", item)
    assert not _may(operator, "DeleteItem", TASK_ITEM)
    # `agentq tenants` and `agentq stats` read what a producer may not.
    for item in (LIMITS_ITEM, SEAT_ITEM, MAPPING_ITEM, ROSTER_ITEM, TASK_ITEM):
        assert _may(operator, "GetItem", item), item["PK"]
    assert not _may(operator, "PutItem", ROSTER_ITEM)
    # The worker's lock transaction takes, renews and frees seats under TENANT#.
    assert _may(worker, "UpdateItem", SEAT_ITEM) and _may(worker, "UpdateItem", TASK_ITEM)
    assert _may(worker, "PutItem", ROSTER_ITEM)


# -- moto's server enforcing them --------------------------------------------------------
@pytest.fixture(scope="module")
def enforced() -> Iterator[tuple[MotoServer, LocalResources]]:
    with MotoServer(iam=True) as server:
        clients = local_session_clients(server.url)
        yield server, provision(clients, ResourceNames(stage="iamc"), endpoint_url=server.url)


def _user(server: MotoServer, resources: LocalResources, name: str,
          statements: list[dict[str, Any]]) -> Credentials:  # fmt: skip
    iam = boto3.client("iam", endpoint_url=server.url, region_name=LOCAL_REGION,
                       aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    (user,) = create_component_users(
        iam, resources, {name: statements}, region=LOCAL_REGION, account=ACCOUNT_ID
    ).values()
    return user


def _client(server: MotoServer, user: Credentials, service: str) -> Any:
    return boto3.client(service, endpoint_url=server.url, region_name=LOCAL_REGION,
                        aws_access_key_id=user.access_key_id,
                        aws_secret_access_key=user.secret_access_key)  # fmt: skip


def _denied(call: Any) -> bool:
    try:
        call()
    except ClientError as error:
        return "is not authorized to perform" in str(error)
    return False


def _status(call: Any) -> int:
    try:
        call()
    except ClientError as error:
        return int(error.response["ResponseMetadata"]["HTTPStatusCode"])
    return 200


BUCKET_ARN = "arn:aws:s3:::${agentq:bucket}"
TABLE_ARN = "arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${agentq:events_table}"


def test_iam_enforced_a_listing_outside_its_prefix_condition_is_denied(
    enforced: tuple[MotoServer, LocalResources],
) -> None:
    server, resources = enforced
    user = _user(server, resources, "lister", [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET_ARN,
         "Condition": {"StringLike": {"s3:prefix": ["task/*"]}}}])  # fmt: skip
    s3 = _client(server, user, "s3")
    bucket = resources.bucket
    assert _status(lambda: s3.list_objects_v2(Bucket=bucket, Prefix="task/acme/")) == 200
    assert _status(lambda: s3.list_objects_v2(Bucket=bucket, Prefix="dlq/archive/")) == 403
    assert _status(lambda: s3.list_objects_v2(Bucket=bucket)) == 403  # no prefix: no match


def test_iam_enforced_an_item_outside_its_leading_keys_condition_is_denied(
    enforced: tuple[MotoServer, LocalResources],
) -> None:
    server, resources = enforced
    user = _user(server, resources, "tenant-reader", [
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:Query"],
         "Resource": TABLE_ARN,
         "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TASK#acme#*"]}}}])  # fmt: skip
    ddb = _client(server, user, "dynamodb")
    table = resources.table_name
    mine = {"PK": {"S": "TASK#acme#1"}, "SK": {"S": "STATE"}}
    other = {"PK": {"S": "TASK#other#1"}, "SK": {"S": "STATE"}}
    assert _status(lambda: ddb.get_item(TableName=table, Key=mine)) == 200
    assert _denied(lambda: ddb.get_item(TableName=table, Key=other))

    def query(pk: str) -> Any:
        return ddb.query(TableName=table, KeyConditionExpression="PK = :p",
                         ExpressionAttributeValues={":p": {"S": pk}})  # fmt: skip

    assert _status(lambda: query("TASK#acme#1")) == 200
    assert _denied(lambda: query("TASK#other#1"))


def test_iam_enforced_a_missing_key_is_403_without_list_bucket_and_404_with_it(
    enforced: tuple[MotoServer, LocalResources],
) -> None:
    server, resources = enforced
    read = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{BUCKET_ARN}/task/*"}
    reader = _client(server, _user(server, resources, "reader", [read]), "s3")
    lister = _client(server, _user(server, resources, "reader-lister", [
        read, {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET_ARN}]), "s3")  # fmt: skip
    bucket, missing, present = resources.bucket, "task/acme/r/none.json", "task/acme/r/a.json"
    local_session_clients(server.url)["s3"].put_object(Bucket=bucket, Key=present, Body=b"{}")
    assert _status(lambda: reader.get_object(Bucket=bucket, Key=present)) == 200
    assert _status(lambda: reader.get_object(Bucket=bucket, Key=missing)) == 403
    assert _status(lambda: reader.head_object(Bucket=bucket, Key=missing)) == 403
    assert _status(lambda: lister.get_object(Bucket=bucket, Key=missing)) == 404
    assert _status(lambda: lister.head_object(Bucket=bucket, Key=missing)) == 404
    # The operator may list: moto's own 404.
    operator = local_session_clients(server.url)["s3"]
    assert _status(lambda: operator.get_object(Bucket=bucket, Key=missing)) == 404


def _worker_s3(
    enforced: tuple[MotoServer, LocalResources],
    synthesized: dict[str, list[dict[str, Any]]],
    user: str,
) -> tuple[LocalResources, Any, Any]:
    """The stage, S3 as a user with the worker's synthesized role, and as the operator."""
    server, resources = enforced
    worker = _client(server, _user(server, resources, user, synthesized["worker"]), "s3")
    return resources, worker, local_session_clients(server.url)["s3"]


def test_iam_enforced_the_worker_finds_an_earlier_attempts_checkpoint_past_a_403(
    enforced: tuple[MotoServer, LocalResources],
    synthesized: dict[str, list[dict[str, Any]]],
    tmp_path: Any,
) -> None:
    # The worker's own role (as the stacks grant it) reads `task/*` but may not list the
    # bucket: the missing attempt-2 checkpoint is a 403, the attempt-1 one is read, and
    # the HEAD for a newer part past the two its whole checkpoint covers is a 403 too.
    from agentq.checkpoints import encode_whole, next_snapshot, part_key, split
    from worker.settle.checkpoints import checkpoint_key, restore

    resources, worker, operator = _worker_s3(enforced, synthesized, "ckpt-worker")
    key = checkpoint_key("acme", "r-ckpt", 1)
    whole = b'{"agentq_checkpoint": 1, "session_id": "6c1f5bd0-0000-4000-8000-000000000001", ' \
        b'"turns": 1, "entries": 1}\n{"n": 0}\n'  # fmt: skip
    operator.put_object(Bucket=resources.bucket, Key=key, Body=encode_whole(split(whole), parts=2))
    newer = part_key("acme", "r-ckpt", 1, next_snapshot(2))
    assert _status(lambda: worker.head_object(Bucket=resources.bucket, Key=newer)) == 403
    missing = checkpoint_key("acme", "r-ckpt", 2)
    assert _status(lambda: worker.get_object(Bucket=resources.bucket, Key=missing)) == 403

    offered = restore(worker, resources.bucket, tenant="acme", request_id="r-ckpt", attempt=2,
                      task_dir=tmp_path)  # fmt: skip

    assert offered == {"from_attempt": 1, "parts": 2}


def test_iam_enforced_the_worker_joins_a_killed_attempts_parts_past_403s(
    enforced: tuple[MotoServer, LocalResources],
    synthesized: dict[str, list[dict[str, Any]]],
    tmp_path: Any,
) -> None:
    # A killed attempt left parts and no whole checkpoint: the whole one, the next
    # snapshot and the part after the last all answer 403 to the worker's role.
    from agentq.checkpoints import Part, encode_part, part_key
    from worker.kinds.agent.checkpoint import RESTORE_FILE
    from worker.settle.checkpoints import restore

    resources, worker, operator = _worker_s3(enforced, synthesized, "parts-worker")
    session = "6c1f5bd0-0000-4000-8000-000000000001"
    for number, (first, lines) in enumerate([(0, [b'{"n": 0}']), (1, [b'{"n": 1}'])], 1):
        body = encode_part(Part(session_id=session, turns=number, first_entry=first, lines=lines))
        operator.put_object(Bucket=resources.bucket, Body=body,
                            Key=part_key("acme", "r-parts", 1, number))  # fmt: skip
    assert _status(lambda: worker.head_object(Bucket=resources.bucket,
                                              Key=part_key("acme", "r-parts", 1, 3))) == 403  # fmt: skip

    offered = restore(worker, resources.bucket, tenant="acme", request_id="r-parts", attempt=2,
                      task_dir=tmp_path)  # fmt: skip

    assert offered == {"from_attempt": 1, "parts": 2}
    restored = (tmp_path / RESTORE_FILE).read_bytes().splitlines()
    assert restored[1:] == [b'{"n": 0}', b'{"n": 1}']
