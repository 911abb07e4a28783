"""The processor's reading of "attempts left" and the write's condition agree.

`attempts_left` decides, from the STATE item read, whether to try a return; the
conditional write decides it again on the item as it is. If they disagreed, a task
could be failed while the write would have returned it, or be counted and then not
sent. Hypothesis draws STATE items; moto evaluates the condition.
"""

from __future__ import annotations

import uuid

from conftest import Stack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentq.events import now_ms
from agentq.states import TaskState
from agentq.store import TaskStore, keys
from agentq.store.codec import to_item
from agentq.store.records import ATTEMPT_ALLOWANCE
from agentq.store.returns import attempts_left, count_return, returns_of

STATES = st.sampled_from([TaskState.PENDING, TaskState.RETRYING, TaskState.PROCESSING,
                          TaskState.BLOCKED, TaskState.COMPLETED, TaskState.FAILED])  # fmt: skip


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    state=STATES,
    attempt=st.integers(min_value=0, max_value=4),
    budget=st.one_of(st.none(), st.integers(min_value=1, max_value=4)),
    lapsed=st.booleans(),
    returns=st.integers(min_value=0, max_value=3),
    # Raised by a shutdown's release (agentq.store.records): one more attempt each.
    allowance=st.one_of(st.none(), st.integers(min_value=1, max_value=5)),
)
def test_attempts_left_is_what_the_return_write_allows(
    stack: Stack,
    state: TaskState,
    attempt: int,
    budget: int | None,
    lapsed: bool,
    returns: int,
    allowance: int | None,
) -> None:
    request_id = f"p-{uuid.uuid4().hex[:12]}"
    now = now_ms()
    stack.dynamodb.put_item(
        TableName=stack.resources.table_name,
        Item=to_item({
            "PK": keys.task_pk("acme", request_id), "SK": keys.STATE_SK,
            "requestId": request_id, "tenant": "acme", "state": state.value,
            "attempt": attempt, "maxAttempts": budget,
            "effectiveUntil": now - 60_000 if lapsed else now + 60_000,
            "dlqReturns": returns or None, ATTEMPT_ALLOWANCE: allowance,
        }),
    )  # fmt: skip
    tasks = TaskStore(stack.dynamodb, stack.resources.table_name)
    record = tasks.require("acme", request_id)
    letter = uuid.uuid4().hex

    counted = count_return(stack.dynamodb, stack.resources.table_name, record, message_id=letter)

    assert counted == attempts_left(record)
    after = tasks.require("acme", request_id)
    assert returns_of(after) == returns + (1 if counted else 0)
    assert (after.raw.get("dlqReturnOf") == letter) == counted


def test_a_released_attempt_leaves_the_task_an_attempt_to_return_to(stack: Stack) -> None:
    """Attempt 3 of 3 was run, but attempt 1 was released at a shutdown: one is left."""
    request_id = f"p-{uuid.uuid4().hex[:12]}"
    stack.dynamodb.put_item(
        TableName=stack.resources.table_name,
        Item=to_item({
            "PK": keys.task_pk("acme", request_id), "SK": keys.STATE_SK,
            "requestId": request_id, "tenant": "acme", "state": TaskState.RETRYING.value,
            "attempt": 3, "maxAttempts": 3, ATTEMPT_ALLOWANCE: 4,
        }),
    )  # fmt: skip
    record = TaskStore(stack.dynamodb, stack.resources.table_name).require("acme", request_id)

    assert attempts_left(record)
    assert count_return(stack.dynamodb, stack.resources.table_name, record, message_id="m-1")
