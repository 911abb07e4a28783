"""S3 keys of task outputs are scoped by tenant, request and attempt, and a reader
refuses a pointer outside the task's own folder (agentq.store.keys, agentq.jobs.results)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.envelope import REQUEST_ID_PATTERN, TENANT_PATTERN
from agentq.errors import InvalidInput, NotFound
from agentq.jobs.results import ResultReader, artifacts_pointer, result_key
from agentq.states import TaskState
from agentq.store.keys import attempt_prefix
from agentq.store.tasks import TaskRecord

tenants = st.from_regex(TENANT_PATTERN, fullmatch=True)
request_ids = st.from_regex(REQUEST_ID_PATTERN, fullmatch=True)
attempts = st.integers(min_value=1, max_value=1000)


def _record(tenant: str, request_id: str, **raw: Any) -> TaskRecord:
    return TaskRecord(
        request_id=request_id, tenant=tenant, state=TaskState.COMPLETED, attempt=1,
        definition=None, job_id=None, owner=None, lease_token=None, effective_until_ms=None,
        created_at_ms=None, updated_at_ms=None,
        raw={"requestId": request_id, "tenant": tenant, **raw},
    )  # fmt: skip


@given(tenants, request_ids, attempts, tenants, request_ids, attempts)
def test_two_attempts_of_two_tasks_never_share_a_folder(
    t1: str, r1: str, a1: int, t2: str, r2: str, a2: int
) -> None:
    one, two = attempt_prefix(t1, r1, a1), attempt_prefix(t2, r2, a2)
    if (t1, r1, a1) != (t2, r2, a2):
        # Neither folder contains the other: no key of one is ever a key of the other.
        assert not one.startswith(two) and not two.startswith(one)
    else:
        assert one == two


@given(tenants, request_ids, attempts, tenants, request_ids)
def test_a_reader_follows_only_a_pointer_into_the_tasks_own_folder(
    owner: str, request_id: str, attempt: int, tenant: str, other_id: str
) -> None:
    key = result_key(owner, request_id, attempt)
    record = _record(tenant, other_id, result={"bucket": "b", "key": key},
                     artifacts={"bucket": "b", "prefix": attempt_prefix(owner, request_id, attempt)})  # fmt: skip
    reader = ResultReader(s3=None, bucket="b")
    if (tenant, other_id) == (owner, request_id):
        assert reader.pointer(record) == ("b", key)
        assert artifacts_pointer(record) == ("b", attempt_prefix(owner, request_id, attempt))
    else:
        with pytest.raises(InvalidInput):
            reader.pointer(record)
        with pytest.raises(InvalidInput):
            artifacts_pointer(record)


def test_no_pointer_no_result_and_no_guessing() -> None:
    record = _record("acme", "r-1")
    with pytest.raises(NotFound):
        ResultReader(s3=None, bucket="b").pointer(record)
    assert artifacts_pointer(record) is None
    # The layout before tenants and attempts were in the key is not followed either.
    legacy = _record("acme", "r-1", result={"key": "task/logs/r-1/artifacts/task-result.json"})
    with pytest.raises(InvalidInput):
        ResultReader(s3=None, bucket="b").pointer(legacy)
