"""A diamond job on the local stack with nothing played by the test: a real worker runs
the tasks, EventBridge routes their terminal events to the Lambda host, and the real
dispatcher enqueues the successors with the results the worker stored."""

from __future__ import annotations

import pytest
from conftest import Stack
from support import wait_for

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.local.lambda_host import LambdaHost
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_jobs_diamond_runs_end_to_end_on_a_worker(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", str(SAMPLE_DEFINITIONS))
    client = AgentqClient.from_env()
    spec = {
        "tasks": {
            "A": {"definition": "sample-echo", "input": {"v": 1}},
            "B": {"definition": "sample-echo", "input": {"from_a": "${tasks.A.result}"}},
            "C": {"definition": "sample-echo", "input": {"v_of_a": "${tasks.A.result.v}"}},
            "D": {"definition": "sample-echo",
                  "input": {"b": "${tasks.B.result}", "c": "${tasks.C.result}"}},
        }
    }  # fmt: skip
    env = {**stack.env(), **fast_env()}
    with (
        LambdaHost(stack.resources, Settings.from_env(), sqs=stack.sqs, health_interval_s=0,
                   serve_dlq=False) as host,
        WorkerProcess("jobs-e2e").start(env) as worker,
    ):  # fmt: skip
        client.create_job(spec, job_id="e2e")
        job = client.wait(job_id="e2e", timeout_s=120, poll_s=0.2)
        assert job.state == "COMPLETED", worker.output()[-3000:]
        # The invocation that closed the job is counted once the handler returns.
        wait_for(lambda: host.invocations["dispatcher"] >= 4, timeout=30,
                 message="four dispatcher invocations")  # fmt: skip
    assert client.result("e2e-D") == {"b": {"from_a": {"v": 1}}, "c": {"v_of_a": 1}}
    tasks = client.job_tasks(client.get_job("e2e"))
    finished = {key: record.raw["finishedAt"] for key, record in tasks.items() if record}
    assert finished["A"] < min(finished["B"], finished["C"])
    assert max(finished["B"], finished["C"]) < finished["D"]
    assert {record.attempt for record in tasks.values() if record} == {1}
