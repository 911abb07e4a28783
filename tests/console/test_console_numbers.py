"""One set of numbers: a task's run time, attempts and state read the same in every
view: `agentq status --json` and `job status` (agentq.jobs.summary.task_dict), the
console's tasks page (whose rows its job page shares), task page and its attempts,
and the task's end event, which `agentq stats` counts.

Real worker and children against moto's server: a task that sleeps, and one that fails
once then completes (two attempts)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack
from support import EventLog

from agentq.aws import AwsClients
from agentq.client import AgentqClient
from agentq.console.artifacts import TaskArtifacts
from agentq.console.reads import ConsoleReader, attempts_of
from agentq.console.search import Filters
from agentq.definitions import DefinitionRegistry, DefinitionsTable
from agentq.jobs.summary import task_dict
from agentq.local.aws import LOCAL_REGION
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env

pytestmark = pytest.mark.timeout(180)

TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "slow": ("sample-sleep", {"seconds": 0.4}),
    "flaky": ("sample-fail", {"category": "server", "times": 1}),
}


def test_every_view_gives_a_task_the_same_run_time_attempts_and_state(stack: Stack) -> None:
    events = EventLog(stack)
    client = AgentqClient.from_env()
    # Known to the submit's validation as the worker knows them.
    samples = DefinitionRegistry.from_sources(directories=[SAMPLE_DEFINITIONS])
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    for definition, _ in TASKS.values():
        table.put(samples.get(definition))
    with WorkerProcess("numbers").start({**stack.env(), **fast_env()}):
        ids = {key: client.submit(definition, given, tenant="acme").request_id
               for key, (definition, given) in TASKS.items()}  # fmt: skip
        ends = {key: events.wait(rid, "Task Completed")[0] for key, rid in ids.items()}
    aws = AwsClients(LOCAL_REGION)
    reader = ConsoleReader(client, TaskArtifacts(aws.s3, client.results, client.outputs))

    for key, end in ends.items():
        ran = end["payload"]["duration_ms"]  # the worker's measure, as stats counts it
        page = reader.task("acme", ids[key])
        # The attempts the task page draws from its stored events (here as the bus
        # carried them: no save-event Lambda runs beside this stack).
        last = attempts_of(events.of(ids[key]))[-1]
        status = task_dict(client.get_task(ids[key], tenant="acme"))
        # The tasks page's row (a search by the whole request id: the rows of the job
        # page and of the newest tasks are built the same, agentq.console.jobtasks).
        [row] = [r for r in reader.tasks("acme", Filters(text=ids[key]))["tasks"]
                 if r["requestId"] == ids[key]]  # fmt: skip
        seen = {
            "status": (status["durationMs"], status["attempt"], status["state"]),
            "tasks page": (row["durationMs"], row["attempt"], row["state"]),
            "task page": (page["task"]["durationMs"], page["task"]["attempt"],
                          page["task"]["state"]),
            "its last attempt": (last["durationMs"], last["attempt"],
                                 "COMPLETED" if last["exit"] == "Task Completed" else last["exit"]),
        }  # fmt: skip
        assert set(seen.values()) == {(ran, end["attempt"], "COMPLETED")}, (key, ran, seen)
    assert ends["flaky"]["attempt"] == 2 and ends["slow"]["payload"]["duration_ms"] >= 400
