"""The console in Debian's headless chromium, against real work on the local stack.

A real worker runs the job (python tasks and one agent task answered by the offline
model server), EventBridge routes events to the Lambda host's real handlers, and the
page is watched while the job runs: its DAG must change without a reload.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Stack
from console_support import browser, running_console, signed_in
from playwright.sync_api import Browser, Page
from support import wait_for

from agentq.client import AgentqClient
from agentq.config import Settings
from agentq.dlq import DlqArchive
from agentq.envelope import TaskEnvelope
from agentq.local.claude_env import offline_claude_env
from agentq.local.lambda_host import LambdaHost
from agentq.local.model_server import ModelServer
from agentq.local.stack import REPO_ROOT
from agentq.local.workers import SAMPLE_DEFINITIONS, WorkerProcess, fast_env
from agentq.states import TaskState

__all__ = ["browser"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DEFINITIONS = os.pathsep.join([str(SAMPLE_DEFINITIONS), str(REPO_ROOT / "definitions" / "samples")])
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
SECOND = 1000


@pytest.fixture
def stage(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    monkeypatch.setenv("TASK_DEFINITIONS_DIR", DEFINITIONS)
    # The in-process Lambda host's metrics and logs would drown the test's output.
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "WARNING")
    return stack


@pytest.fixture
def worker_env(stage: Stack) -> Iterator[dict[str, str]]:
    """What a worker needs to run python and agent tasks against the offline model."""
    scratch = Path(tempfile.mkdtemp(prefix="agentq-console-test-"))
    home = scratch / "home"
    home.mkdir()
    model = ModelServer().start()
    try:
        yield {
            **stage.env(),
            **fast_env(TASK_DEFINITIONS_DIR=DEFINITIONS),
            **offline_claude_env(model.url, home),
            "HOME": str(home),
            "AGENTQ_WORK_DIR": str(scratch / "work"),
        }
    finally:
        model.stop()


def states(page: Page) -> dict[str, str]:
    found: dict[str, str] = page.eval_on_selector_all(
        "#dag g.task",
        "nodes => Object.fromEntries(nodes.map(n => [n.dataset.key, n.dataset.state]))",
    )
    return found


def test_job_page_follows_a_running_job_and_task_pages_show_trace_logs_and_text(
    stage: Stack, worker_env: dict[str, str], browser: Browser
) -> None:
    client = AgentqClient.from_env()
    spec = {
        "tasks": {
            "A": {"definition": "sample-echo", "input": {"html": HOSTILE}},
            "B": {"definition": "sample-echo", "input": {"from_a": "${tasks.A.result}"}},
            "C": {"definition": "sample-echo", "input": {"v": 3}, "depends_on": ["A"]},
            "D": {"definition": "summarize", "depends_on": ["B", "C"],
                  "input": {"document": "Release 4.2 ships on Friday; Ana owns the rollout."}},
        }
    }  # fmt: skip
    with (
        LambdaHost(stage.resources, Settings.from_env(), sqs=stage.sqs, health_interval_s=0,
                   serve_dlq=False),
        running_console() as console,
    ):  # fmt: skip
        client.create_job(spec, job_id="live")
        page = signed_in(browser, console)
        page.goto(f"{console.base_url}/jobs/live")
        page.wait_for_selector("body[data-drawn='1']")
        assert states(page) == {"A": "PENDING", "B": "BLOCKED", "C": "BLOCKED", "D": "BLOCKED"}
        page.evaluate("window.__sameDocument = true")  # gone if the page reloads

        with WorkerProcess("console-e2e").start(worker_env) as worker:
            try:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('#dag g.task')]"
                    ".every(n => n.dataset.state === 'COMPLETED')",
                    timeout=180 * SECOND,
                )
            except Exception:
                print(worker.output()[-5000:])
                raise
            assert page.evaluate("window.__sameDocument") is True
            assert int(page.get_attribute("body", "data-draws") or 0) > 2
            page.wait_for_function("() => document.querySelector('#why').textContent.startsWith('completed')",
                                   timeout=30 * SECOND)  # fmt: skip

            # The agent task: its trace (turns, the structured-output tool call) and logs.
            # The job closed on D's state; its Task Completed event is persisted apart.
            wait_for(lambda: any(e.get("detailType") == "Task Completed"
                                 for e in client.events("live-D")),
                     timeout=30, message="D's Task Completed event persisted")  # fmt: skip
            page.goto(f"{console.base_url}/tasks/live-D")
            page.wait_for_selector("#trace #turns")
            assert "StructuredOutput" in page.inner_text("#tool-calls")
            assert "outcome: completed" in page.inner_text("#logs")  # logs/summary.log
            assert "summary.log" in page.inner_text("#objects")
            assert page.inner_text("#attempts").count("Task Completed") == 1

            # Hostile input and its echo are shown as text and never run.
            page.goto(f"{console.base_url}/tasks/live-A")
            page.wait_for_selector("body[data-drawn='1']")
            for section in ("#input", "#result"):
                assert "<script>window.__xss=2</script>" in page.inner_text(section)
                assert "<img src=x onerror=" in page.inner_text(section)
            assert page.eval_on_selector_all("#app img, #app script", "nodes => nodes.length") == 0
            assert page.evaluate("window.__xss") is None


def test_a_dead_letter_is_redriven_from_the_page_and_completes(
    stage: Stack, worker_env: dict[str, str], browser: Browser
) -> None:
    client = AgentqClient.from_env()
    task = client.submit("sample-echo", {"v": "redriven"})
    with (
        LambdaHost(stage.resources, Settings.from_env(), sqs=stage.sqs, health_interval_s=0),
        running_console(allow_actions=True) as console,
    ):
        # The one attempt it was allowed was taken by a worker that crashed (its lease
        # lapses); three receives that never finish then move the message to the DLQ,
        # and the dlq-processor archives it and fails the task: no attempt is left.
        record = client.tasks.require(client.settings.tenant_id, task.request_id)
        envelope = TaskEnvelope.from_dict(dict(record.envelope or {}), default_tenant="default")
        client.tasks.acquire(envelope, worker_id="crashed", lease_seconds=1, max_attempts=1)
        wait_for(lambda: not client.get_task(task.request_id).lease_live(), timeout=30,
                 message="the crashed worker's lease lapsed")  # fmt: skip
        for _ in range(3):
            got = stage.sqs.receive_message(QueueUrl=stage.resources.queue_url,
                                            VisibilityTimeout=0, WaitTimeSeconds=5)  # fmt: skip
            assert len(got.get("Messages", [])) == 1
        archive = DlqArchive(stage.s3, stage.resources.bucket)

        def archived() -> bool:
            stage.sqs.receive_message(QueueUrl=stage.resources.queue_url, WaitTimeSeconds=0)
            return any(m.request_id == task.request_id for m in archive.list())

        wait_for(archived, timeout=60, message="the dead letter archived")
        wait_for(lambda: client.get_task(task.request_id).state is TaskState.FAILED, timeout=30,
                 message="the task failed by the dlq-processor")  # fmt: skip

        page = signed_in(browser, console)
        page.goto(f"{console.base_url}/dlq")
        row = f"#letters tr[data-request='{task.request_id}']"
        page.wait_for_selector(row)
        assert "not redriven" in page.inner_text(row)
        page.check(f"{row} input[type=checkbox]")
        page.click("text=Redrive selected")
        page.wait_for_function(
            "() => document.querySelector('#dlq-result').textContent.includes('redriven')",
            timeout=30 * SECOND,
        )
        with WorkerProcess("console-dlq").start(worker_env):
            final = client.wait(task.request_id, timeout_s=120, poll_s=0.2)
        assert final.state is TaskState.COMPLETED
        assert client.result(task.request_id) == {"v": "redriven"}
        page.wait_for_function(
            f"() => document.querySelector(\"{row} td.redriven\").textContent.startsWith('redriven')",
            timeout=30 * SECOND,
        )
        # The action is in the task's timeline with who did it.
        recorded = wait_for(
            lambda: [e for e in client.events(task.request_id) if e["detailType"] == "Operator Action"],
            timeout=30, message="the operator action stored",
        )  # fmt: skip
        assert recorded[0]["payload"]["action"] == "redrive"
        assert recorded[0]["payload"]["operator"]["arn"].startswith("arn:aws:")
