"""A continuation is refused, saying why, for a tenant whose transcripts are off: from the
tenant's setting where the submitter may read it, else from the mark a worker leaves on
the source's STATE item."""

from __future__ import annotations

import pytest

from agentq.continuation import ContinueRefused, check_continuable
from agentq.states import TaskState
from agentq.store import TaskRecord
from agentq.store.keys import attempt_prefix, checkpoint_key


def _record(**raw: object) -> TaskRecord:
    prefix = attempt_prefix("hush", "r-1", 1)
    fields = {"result": {"bucket": "b", "key": prefix + "artifacts/task-result.json"},
              "checkpoint": {"bucket": "b", "key": checkpoint_key("hush", "r-1", 1)}, **raw}  # fmt: skip
    return TaskRecord(request_id="r-1", tenant="hush", state=TaskState.COMPLETED, attempt=1,
                      definition="chat", job_id=None, owner=None, lease_token=None,
                      effective_until_ms=None, created_at_ms=None, updated_at_ms=None,
                      raw=fields)  # fmt: skip


def test_a_continuable_task_passes_until_its_tenant_turns_transcripts_off() -> None:
    check_continuable(_record(), "r-1", definition=None, transcripts=True)
    check_continuable(_record(), "r-1", definition=None, transcripts=None)
    with pytest.raises(ContinueRefused, match="tenant hush does not store transcripts"):
        check_continuable(_record(), "r-1", definition=None, transcripts=False)


def test_the_workers_mark_refuses_it_where_the_setting_cannot_be_read() -> None:
    marked = _record(transcripts="off")
    with pytest.raises(ContinueRefused, match="tenant hush does not store transcripts"):
        check_continuable(marked, "r-1", definition=None, transcripts=None)
