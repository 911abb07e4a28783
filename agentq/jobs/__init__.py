"""Jobs: DAGs of tasks. Specs and references, the job item, the dispatcher.

See docs/jobs.md for the spec format and the reference syntax.
"""

from agentq.jobs.dispatch import DispatchOutcome, JobDispatcher
from agentq.jobs.results import ResultReader, artifacts_pointer, result_key
from agentq.jobs.spec import (
    FailurePolicy,
    JobSpec,
    TaskSpec,
    check_definitions,
    load_spec_file,
    parse_spec,
    task_request_id,
)
from agentq.jobs.store import JobRecord, JobStore
from agentq.jobs.submitter import TaskSubmitter, request_id_for

__all__ = [
    "DispatchOutcome",
    "FailurePolicy",
    "JobDispatcher",
    "JobRecord",
    "JobSpec",
    "JobStore",
    "ResultReader",
    "TaskSpec",
    "TaskSubmitter",
    "artifacts_pointer",
    "check_definitions",
    "load_spec_file",
    "parse_spec",
    "request_id_for",
    "result_key",
    "task_request_id",
]
