"""The console's batch reads when DynamoDB leaves keys unprocessed (it does, throttled,
without an error): asked again until read, else the page says AWS did not answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse, HTTPHeaders
from conftest import Stack
from console_support import Http, define, running_console
from support import store_events

from agentq.client import AgentqClient
from agentq.console.jobtasks import ATTEMPTS, TasksUnreadable, read_states


class Unprocessed:
    """Answers the first `times` BatchGetItem calls with every key unprocessed, as a
    throttled table does; later calls reach DynamoDB."""

    def __init__(self, client: Any, times: int) -> None:
        self.left = times
        self.calls = 0
        self._asked: dict[str, Any] = {}
        self._events = client.meta.events
        self._events.register("provide-client-params.dynamodb.BatchGetItem", self._keep)
        self._events.register("before-call.dynamodb.BatchGetItem", self._answer)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        self._asked = params["RequestItems"]

    def _answer(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        self.calls += 1
        if self.left <= 0:
            return None
        self.left -= 1
        parsed = {"Responses": {}, "UnprocessedKeys": self._asked}
        return AWSResponse("https://dynamodb.local", 200, HTTPHeaders(), None), parsed

    def remove(self) -> None:
        self._events.unregister("provide-client-params.dynamodb.BatchGetItem", self._keep)
        self._events.unregister("before-call.dynamodb.BatchGetItem", self._answer)


@pytest.fixture
def tasks(inproc_stack: Stack) -> list[str]:
    define(inproc_stack, "noop")
    client = AgentqClient.from_env()
    submitted = [client.submit("noop", {"n": n}).request_id for n in range(3)]
    store_events(inproc_stack)  # the Tasks page finds them through their events
    return submitted


@pytest.fixture
def unprocessed(inproc_stack: Stack) -> Iterator[Any]:
    made: list[Unprocessed] = []

    def make(client: Any, times: int) -> Unprocessed:
        made.append(Unprocessed(client, times))
        return made[-1]

    yield make
    for fault in made:
        fault.remove()


def test_keys_left_unprocessed_are_asked_again_until_read(
    inproc_stack: Stack, tasks: list[str], unprocessed: Any
) -> None:
    fault = unprocessed(inproc_stack.dynamodb, times=ATTEMPTS - 1)
    found = read_states(
        inproc_stack.dynamodb, inproc_stack.resources.table_name, "default", tasks, "test"
    )
    assert sorted(found) == sorted(tasks)
    assert fault.calls == ATTEMPTS


def test_keys_never_processed_end_in_a_clear_failure_not_a_partial_page(
    inproc_stack: Stack, tasks: list[str], unprocessed: Any
) -> None:
    fault = unprocessed(inproc_stack.dynamodb, times=ATTEMPTS)
    with pytest.raises(TasksUnreadable) as caught:
        read_states(
            inproc_stack.dynamodb, inproc_stack.resources.table_name, "default", tasks, "test"
        )
    assert (caught.value.whose, caught.value.left) == ("test", len(tasks))
    assert fault.calls == ATTEMPTS


def test_the_tasks_page_says_aws_did_not_answer_and_the_next_refresh_reads_it(
    inproc_stack: Stack, tasks: list[str], unprocessed: Any
) -> None:
    with running_console() as server:
        http = Http(server)
        http.sign_in()
        client = server.parts.reader.client.dynamodb
        unprocessed(client, times=ATTEMPTS)
        failed = http.request("GET", "/api/tasks")
        assert failed.status == 502 and "unread (throttled)" in failed.json()["detail"], failed
        # Never a page missing the tasks left unread: the next refresh reads them all.
        listed = http.request("GET", "/api/tasks").json()["tasks"]
        assert sorted(row["requestId"] for row in listed) == sorted(tasks)
