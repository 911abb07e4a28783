"""A dispatch's `sentAt` marks under AWS faults.

`sentAt` tells a retried dispatch which of its tasks still need their message. A mark
that met a transaction conflict (a worker's lease renewal already holding the item) used
to fail the whole dispatch after the messages were out, and the marks after it were
never tried: tasks already started stayed "never sent" for good.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from conftest import Stack
from fault_support import dispatch_a_completed, drain_bodies, job_with_a_completed, set_faults

from agentq.faults.log import read_counts
from agentq.jobs import task_request_id
from agentq.states import TaskState

pytestmark = pytest.mark.timeout(120)
FAN_OUT = ("B1", "B2", "B3")


def test_marks_that_meet_transaction_conflicts_are_sent_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job_id, tasks = job_with_a_completed(stack, FAN_OUT)
    log = set_faults(
        monkeypatch,
        tmp_path,
        {"op": "dynamodb:UpdateItem", "kind": "transaction_conflict", "rate": 1, "limit": 3,
         "match": "sentAt"},
    )  # fmt: skip
    dispatch_a_completed(job_id)  # the conflicts do not fail the dispatch
    assert read_counts(str(log)) == {"dynamodb:UpdateItem:transaction_conflict": 3}
    sent = sorted(b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url))
    assert sent == list(FAN_OUT)
    for key in FAN_OUT:
        record = tasks.require("default", task_request_id(job_id, key))
        assert record.state is TaskState.PENDING
        assert "sentAt" in record.raw, key


def test_one_mark_that_keeps_failing_does_not_leave_the_others_unmarked(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job_id, tasks = job_with_a_completed(stack, FAN_OUT)
    # Every attempt botocore makes of the first mark fails (agentq.aws: 1 + 5 retries).
    log = set_faults(
        monkeypatch,
        tmp_path,
        {"op": "dynamodb:UpdateItem", "kind": "server_error", "rate": 1, "limit": 6,
         "match": "SET sentAt = :now"},
    )  # fmt: skip
    with pytest.raises(ClientError):
        dispatch_a_completed(job_id)  # failed: the event is delivered again
    assert read_counts(str(log)) == {"dynamodb:UpdateItem:server_error": 6}
    sent = sorted(b["taskKey"] for b in drain_bodies(stack, stack.resources.queue_url))
    assert sent == list(FAN_OUT)
    marked = ["sentAt" in tasks.require("default", task_request_id(job_id, key)).raw
              for key in FAN_OUT]  # fmt: skip
    assert sorted(marked) == [False, True, True]
