"""The AWS rules the local moto server enforces (agentq.local.rules), each shown
against moto's own answer: every test here fails on moto alone."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from support import wait_for

from agentq.config import Settings
from agentq.envelope import TaskEnvelope
from agentq.faults.config import parse_spec
from agentq.faults.injector import FaultInjector, install
from agentq.health import HealthChecker
from agentq.local.aws import LocalResources, provision_on
from agentq.local.moto_process import MotoServer
from agentq.local.rules import dynamodb_index_lag, dynamodb_transaction_conflict
from agentq.resources import ResourceNames
from agentq.store import EventStore, TaskStore, idempotent, transact

pytestmark = pytest.mark.timeout(120)
HOLD_MS = 1_500
LAG_MS = 1_500


@pytest.fixture(scope="module")
def slow_stack() -> Iterator[tuple[dict[str, Any], LocalResources]]:
    """A moto server of its own whose transactions stay in flight and whose indexes lag."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(dynamodb_transaction_conflict.VARIABLE, str(HOLD_MS))
        env.setenv(dynamodb_index_lag.VARIABLE, str(LAG_MS))
        server = MotoServer().start()
    try:
        yield provision_on(server, ResourceNames(stage="r" + uuid.uuid4().hex[:10]))
    finally:
        server.stop()


def _key(name: str) -> dict[str, Any]:
    return {"PK": {"S": f"RULES#{name}"}, "SK": {"S": "STATE"}}


def _create(table: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"Put": {"TableName": table, "Item": {**_key(name), **extra},
                    "ConditionExpression": "attribute_not_exists(PK)"}}  # fmt: skip


def _code(error: ClientError) -> str:
    return str(error.response["Error"]["Code"])


# -- ClientRequestToken ------------------------------------------------------------------


def test_a_transaction_retried_with_its_token_is_answered_not_applied(stack: Stack) -> None:
    table, token = stack.resources.table_name, uuid.uuid4().hex
    items = [_create(table, "token-1", n={"N": "1"})]
    stack.dynamodb.transact_write_items(TransactItems=items, ClientRequestToken=token)

    # moto alone runs it again: its condition fails against its own first effect.
    stack.dynamodb.transact_write_items(TransactItems=items, ClientRequestToken=token)

    with pytest.raises(ClientError) as refused:
        other = [_create(table, "token-2")]
        stack.dynamodb.transact_write_items(TransactItems=other, ClientRequestToken=token)
    assert _code(refused.value) == "IdempotentParameterMismatchException"
    with pytest.raises(ClientError) as again:  # a new token is a new request
        stack.dynamodb.transact_write_items(TransactItems=items)
    assert _code(again.value) == "TransactionCanceledException"


def test_an_applied_transaction_whose_answer_was_lost_succeeds_on_retry(stack: Stack) -> None:
    """botocore fills `ClientRequestToken` once per call and retries with the same one,
    so agentq's transactions are safe to retry after an applied-but-failed call."""
    spec = parse_spec(
        '{"rules": [{"op": "dynamodb:TransactWriteItems", '
        '"kind": "applied_then_failed", "rate": 1, "limit": 1}]}'
    )
    injector = FaultInjector(spec, seed=7)
    client = install(stack.aws_clients().dynamodb, injector)
    table = stack.resources.table_name

    transact.write(client, [_create(table, "lost-answer", n={"N": "1"})])

    assert injector.counts() == {"dynamodb:TransactWriteItems:applied_then_failed": 1}
    item = stack.dynamodb.get_item(TableName=table, Key=_key("lost-answer"))["Item"]
    assert item["n"] == {"N": "1"}


# -- transactions in flight ------------------------------------------------------------


def _in_flight(clients: dict[str, Any], table: str, name: str) -> threading.Thread:
    """A transaction on item `name`, in flight once this returns (its write visible)."""
    ddb = clients["dynamodb"]
    ddb.put_item(TableName=table, Item={**_key(name), "n": {"N": "0"}})
    update = {"Update": {"TableName": table, "Key": _key(name),
                         "UpdateExpression": "SET n = :one",
                         "ExpressionAttributeValues": {":one": {"N": "1"}}}}  # fmt: skip
    thread = threading.Thread(target=ddb.transact_write_items, kwargs={"TransactItems": [update]})
    thread.start()
    wait_for(lambda: ddb.get_item(TableName=table, Key=_key(name))["Item"]["n"]["N"] == "1",
             timeout=10, interval=0.01, message="the transaction applied")  # fmt: skip
    return thread


def test_a_write_to_an_item_in_a_transaction_in_flight_is_refused(
    slow_stack: tuple[dict[str, Any], LocalResources],
) -> None:
    clients, resources = slow_stack
    ddb, table = clients["dynamodb"], resources.table_name
    holder = _in_flight(clients, table, "held-1")

    with pytest.raises(ClientError) as single:
        ddb.update_item(TableName=table, Key=_key("held-1"), UpdateExpression="SET n = :t",
                        ExpressionAttributeValues={":t": {"N": "2"}})  # fmt: skip
    with pytest.raises(ClientError) as other:
        ddb.transact_write_items(TransactItems=[
            _create(table, "free-1"),
            {"ConditionCheck": {"TableName": table, "Key": _key("held-1"),
                                "ConditionExpression": "attribute_exists(PK)"}},
        ])  # fmt: skip
    holder.join(timeout=30)

    assert _code(single.value) == "TransactionConflictException"
    assert _code(other.value) == "TransactionCanceledException"
    reasons = [r["Code"] for r in other.value.response["CancellationReasons"]]
    assert reasons == ["None", "TransactionConflict"]
    assert "Item" not in ddb.get_item(TableName=table, Key=_key("free-1")), "nothing applied"
    ddb.update_item(TableName=table, Key=_key("held-1"), UpdateExpression="SET n = :t",
                    ExpressionAttributeValues={":t": {"N": "2"}})  # fmt: skip


def _wait_out(conflicts: list[str], name: str, holder: threading.Thread) -> None:
    """The back-off: noted, and as long as the transaction in flight lasts."""
    conflicts.append(name)
    holder.join(timeout=30)


def test_agentq_writes_send_again_after_a_transaction_conflict(
    slow_stack: tuple[dict[str, Any], LocalResources],
) -> None:
    """agentq.store.idempotent and agentq.store.transact back off and send again; the
    back-off here waits for the transaction in flight to end, so the retry is certain."""
    clients, resources = slow_stack
    ddb, table = clients["dynamodb"], resources.table_name
    conflicts: list[str] = []

    holder = _in_flight(clients, table, "held-2")
    written = idempotent.retry_conflicts(
        lambda: ddb.update_item(TableName=table, Key=_key("held-2"),
                                UpdateExpression="SET n = :t",
                                ExpressionAttributeValues={":t": {"N": "2"}}),
        sleep=lambda _s: _wait_out(conflicts, "single", holder),
    )  # fmt: skip
    assert written is not None and conflicts == ["single"]

    holder = _in_flight(clients, table, "held-3")
    check = {"ConditionCheck": {"TableName": table, "Key": _key("held-3"),
                                "ConditionExpression": "attribute_exists(PK)"}}  # fmt: skip
    transact.write(ddb, [_create(table, "free-3"), check],
                   sleep=lambda _s: _wait_out(conflicts, "transaction", holder))  # fmt: skip
    assert conflicts == ["single", "transaction"]
    assert ddb.get_item(TableName=table, Key=_key("free-3"))["Item"]


# -- index lag -------------------------------------------------------------------------


def _by_job(clients: dict[str, Any], table: str, job: str) -> list[dict[str, Any]]:
    return list(clients["dynamodb"].query(
        TableName=table, IndexName="byJob", KeyConditionExpression="jobPK = :pk",
        ExpressionAttributeValues={":pk": {"S": job}},
    )["Items"])  # fmt: skip


def test_an_index_shows_a_write_only_after_its_lag(
    slow_stack: tuple[dict[str, Any], LocalResources],
) -> None:
    clients, resources = slow_stack
    ddb, table = clients["dynamodb"], resources.table_name
    job = f"JOB#acme#{uuid.uuid4().hex[:8]}"
    item = {**_key(f"lag-{job}"), "jobPK": {"S": job}, "jobSK": {"S": "a"}, "v": {"S": "old"}}
    ddb.put_item(TableName=table, Item=item)

    assert _by_job(clients, table, job) == [], "a new item is not in the index yet"
    assert ddb.get_item(TableName=table, Key=_key(f"lag-{job}"), ConsistentRead=True)["Item"]
    (found,) = wait_for(lambda: _by_job(clients, table, job), timeout=30, interval=0.1,
                        message="the index caught up")  # fmt: skip
    assert found["v"] == {"S": "old"}

    ddb.update_item(TableName=table, Key=_key(f"lag-{job}"), UpdateExpression="SET v = :n",
                    ExpressionAttributeValues={":n": {"S": "new"}})  # fmt: skip
    assert [i["v"] for i in _by_job(clients, table, job)] == [{"S": "old"}]
    wait_for(lambda: [i["v"] for i in _by_job(clients, table, job)] == [{"S": "new"}],
             timeout=30, interval=0.1, message="the change reached the index")  # fmt: skip
    ddb.delete_item(TableName=table, Key=_key(f"lag-{job}"))
    assert len(_by_job(clients, table, job)) == 1, "a deleted item lingers in the index"
    wait_for(lambda: not _by_job(clients, table, job), timeout=30, interval=0.1,
             message="the delete reached the index")  # fmt: skip


def test_the_health_check_judges_what_the_index_names_on_the_state_item(
    slow_stack: tuple[dict[str, Any], LocalResources], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease renewed (or a task taken) a moment ago still looks lapsed (or waiting) in
    the lagging status index: no alert for it."""
    clients, resources = slow_stack
    for key, value in resources.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PENDING_ALERT_AFTER", "0")
    ddb, table = clients["dynamodb"], resources.table_name
    tasks = TaskStore(ddb, table)
    lapsing = TaskEnvelope(request_id=f"r-{uuid.uuid4().hex[:8]}", tenant="acme",
                           definition="echo")  # fmt: skip
    waiting = TaskEnvelope(request_id=f"r-{uuid.uuid4().hex[:8]}", tenant="acme",
                           definition="echo")  # fmt: skip
    tasks.create(lapsing)
    tasks.create(waiting)
    lease = tasks.acquire(lapsing, worker_id="w-slow", lease_seconds=0.05, max_attempts=5)
    health = HealthChecker(tasks=tasks, events=EventStore(ddb, table, app_name="agentq"),
                           sqs=clients["sqs"], settings=Settings.from_env())  # fmt: skip

    def in_index(finding: tuple[str, str]) -> bool:
        found = {(f.condition, f.subject) for f in health.check().findings}
        return finding in found

    wait_for(lambda: in_index(("stuck", lapsing.request_id)), timeout=30, interval=0.1,
             message="the lapsed lease in the index")  # fmt: skip
    wait_for(lambda: in_index(("starving", waiting.request_id)), timeout=30, interval=0.1,
             message="the waiting task in the index")  # fmt: skip
    tasks.renew(lease, lease_seconds=60)  # the heartbeat came, just in time
    tasks.acquire(waiting, worker_id="w-fast", lease_seconds=60, max_attempts=5)

    findings = {(f.condition, f.subject) for f in health.check().findings}

    assert ("stuck", lapsing.request_id) not in findings
    assert ("starving", waiting.request_id) not in findings


# -- guards ------------------------------------------------------------------------------


def test_a_rule_refuses_a_moto_whose_internals_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.responses import DynamoHandler

    from agentq.errors import IncompatibleDependency
    from agentq.local.rules import dynamodb_idempotency

    def put_item(self: object, name: str, item: dict[str, Any]) -> None:
        raise AssertionError("never called")

    monkeypatch.setattr(dynamodb_models.DynamoDBBackend, "put_item", put_item)
    for rule in (dynamodb_transaction_conflict, dynamodb_index_lag):
        with pytest.raises(IncompatibleDependency, match="put_item"):
            rule.install()

    def transact_write_items(self: object, items: object) -> None:
        raise AssertionError("never called")

    monkeypatch.setattr(DynamoHandler, "transact_write_items", transact_write_items)
    with pytest.raises(IncompatibleDependency, match="transact_write_items"):
        dynamodb_idempotency.install()


# -- on by default -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_stack() -> Iterator[tuple[dict[str, Any], LocalResources]]:
    """A moto server started with neither rule's variable in its environment."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(dynamodb_transaction_conflict.VARIABLE, raising=False)
        env.delenv(dynamodb_index_lag.VARIABLE, raising=False)
        server = MotoServer().start()
    try:
        yield provision_on(server, ResourceNames(stage="d" + uuid.uuid4().hex[:10]))
    finally:
        server.stop()


def test_indexes_lag_on_a_server_started_without_the_variable(
    default_stack: tuple[dict[str, Any], LocalResources],
) -> None:
    """Off, an index query never misses a write it follows; with the default lag (far
    longer than a request) it misses it, here asked up to five times."""
    clients, resources = default_stack
    missed = 0
    for _attempt in range(5):
        job = f"JOB#acme#{uuid.uuid4().hex[:8]}"
        item = {**_key(f"default-{job}"), "jobPK": {"S": job}, "jobSK": {"S": "a"}}
        clients["dynamodb"].put_item(TableName=resources.table_name, Item=item)
        missed += _by_job(clients, resources.table_name, job) == []
        if missed:
            break
    assert missed, "an index query right after a write saw it every time: no lag"


def test_transactions_stay_in_flight_on_a_server_started_without_the_variable(
    default_stack: tuple[dict[str, Any], LocalResources],
) -> None:
    """Writes to an item, sent back to back while a transaction on it runs, meet its
    time in flight at least once (off, none ever conflicts); up to five transactions."""
    clients, resources = default_stack
    ddb, table = clients["dynamodb"], resources.table_name
    conflicts: list[str] = []
    for attempt in range(5):
        name = f"default-held-{attempt}"
        done = threading.Event()
        writer = threading.Thread(target=_write_until, args=(ddb, table, name, done, conflicts))
        writer.start()
        ddb.transact_write_items(TransactItems=[
            {"Update": {"TableName": table, "Key": _key(name), "UpdateExpression": "SET t = :t",
                        "ExpressionAttributeValues": {":t": {"N": "1"}}}},
        ])  # fmt: skip
        done.set()
        writer.join(timeout=30)
        if conflicts:
            break
    assert conflicts == ["TransactionConflictException"] * len(conflicts) != []


def _write_until(
    ddb: Any, table: str, name: str, done: threading.Event, conflicts: list[str]
) -> None:
    while not done.is_set():
        try:
            ddb.put_item(TableName=table, Item={**_key(name), "w": {"N": "1"}})
        except ClientError as error:
            conflicts.append(_code(error))
